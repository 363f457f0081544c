// Package alerttest evaluates keylane's alert rules (docs/alerts.yml)
// with Prometheus's own rule manager, PromQL engine and storage
// (github.com/prometheus/prometheus), over the real /metrics of worker
// command processes on an in-process NATS server: no rule fires while
// two namespaces run their jobs; each paging rule fires, for the right
// namespace and no other, when every worker of one namespace is killed
// with a job waiting and the other's dead letters grow; KeylaneNoWorker
// fires once every worker is dead.
//
// It is a module of its own, with a replace of the library (../..), so
// that the library's go.mod does not carry a Prometheus server;
// scripts/test runs it.
package alerttest
