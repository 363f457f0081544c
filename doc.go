// Package keylane makes work on a shared resource exclusive without a
// distributed lock.
//
// Every job names a resource key ("sku:123", "seat:A7"). The key is hashed
// onto one of N partitions of a NATS JetStream stream; exactly one worker owns
// a partition at a time, through a lease in a NATS KV bucket, and runs that
// partition's jobs one key at a time, in stream order. A hot key costs no
// retries, no spinning and no lock round trips.
//
// A producer uses a Client:
//
//	c, _ := keylane.NewClient(ctx, nc, keylane.ClientConfig{})
//	res, err := c.Call(ctx, "sku:42", []byte("buy 1"))
//
// A worker process runs a Worker with a Reducer, a pure function from a
// key's state and a job to the new state and the job's result:
//
//	w, _ := keylane.NewWorker(nc, keylane.WorkerConfig{Reducer: r})
//	err := w.Run(ctx, 30*time.Second)
//
// The worker keeps each key's state in a KV bucket and group-commits: it
// reduces a key's queued jobs in memory and stores the outcome with one
// compare-and-set carrying the last job's stream sequence, the fencing
// token and every job's result, so each job takes effect exactly once and a
// hot key costs one write per group, not per job.
//
// Jobs with outside side effects use a Handler instead, which runs one job
// at a time per key; State.Apply gives it the same exactly-once state
// updates (one write per job), and Job.Fence and Job.Seq let it make the
// same check in its own store.
//
// A worker and a client report what they measure (queue wait, run time,
// group size, end-to-end latency and lease renews; every Submit and Call)
// to an optional WorkerConfig.Observer and ClientConfig.Observer, which
// cost nothing when unset; package metrics turns them into Prometheus
// metrics.
//
// How keylane uses JetStream — the namespace's streams and buckets, every
// failure case and the test that covers it — is written down in package
// jetstream (documentation only: see its doc.go for why). The lease
// protocol is written down in package lease, the mapping of keys to
// partitions in package partition, and classic Redis locks, for code that
// cannot become a job, in package fallback.
//
// Clients and workers take a *nats.Conn, so authentication and TLS are the
// connection's: nats.UserCredentials, nats.UserInfo, nats.RootCAs,
// nats.ClientCert. Users that NATS permissions keep to one namespace each
// also take their replies under that namespace's own prefix:
// TopologyConfig.ReplyPrefix when the namespace is created, and
// nats.CustomInboxPrefix on every connection. docs/security/accounts.conf
// is such a configuration, tested against a real server.
//
// # Tracing
//
// Tracing is off unless ClientConfig.TracerProvider or
// WorkerConfig.TracerProvider is set; keylane never falls back to the
// global provider. Off, each hook is a nil check: no header is written or
// read and nothing is allocated. The library imports only the
// OpenTelemetry API; the application brings the SDK and an exporter. The
// worker and submit commands bring both with --otlp-endpoint URL (env
// KEYLANE_OTLP_ENDPOINT): spans in batches over OTLP/HTTP to a collector,
// service.name keylane-worker or keylane-submit, the last spans sent on a
// graceful stop (TestOTLPEndpoint).
//
// Submit and Call start a producer span, "keylane.submit <namespace>" or
// "keylane.call <namespace>", under the caller's ctx, and send its
// context in the job's headers (through the Propagator, W3C traceparent
// by default). Call's span lasts until the result comes and carries its
// error (a RemoteError, a NoReplyError). SubmitMany starts one span,
// "keylane.submit_many <namespace>", whose context goes in every job of
// the batch; Redrive submits through Submit. Attributes follow the
// OpenTelemetry messaging conventions: messaging.system=nats,
// messaging.destination.name (the partition's subject),
// messaging.destination.partition.id, messaging.message.id (the job ID),
// and keylane.key. A trace context that would take a job past its size
// limit is left out, never a reason to refuse the job.
//
// The worker gives each job a consumer span, "keylane.process
// <namespace>", a child of the context in its headers: a root span when
// there is none or it does not parse (a malformed traceparent never fails
// a job). It starts at the job's stream timestamp and ends when the job is
// acked, dead-lettered or left unacked, with keylane.outcome saying which
// and an error status unless acked. Its children are spans, not events,
// since each has a duration worth seeing:
//
//   - keylane.queue, from the stream timestamp to the job's first run on
//     this worker: the queue wait (keylane.delivered counts deliveries);
//   - keylane.run, one per attempt, around the Handler or Reducer. The ctx
//     they get carries it, so their own spans nest under it. A failed
//     attempt is an error span and a keylane.attempt_failed event on the
//     job's span; dead-lettering is a keylane.dead_lettered event there;
//   - keylane.commit, settling the job: for a Handler job, keeping its
//     outcome, the reply and the ack (a Handler's own State.Apply writes
//     are inside its run); for a Reducer job, also the state write.
//
// A group commit stores several jobs with one compare-and-set, so it is
// one commit span, not one per job: its parent is the group's last job,
// whose stream sequence the write records, and it links to the other
// jobs' spans, each of which links back to it (keylane.group.size counts
// the jobs). One span per job would record a 256-job group's one write
// 256 times; a root span would not show in the trace of any job. A failed
// group write is a commit span with an error status. A job that a failed
// group puts back in its lane ends its span with keylane.outcome=requeued
// and gets a new one when it runs again: no span outlives the run of the
// key's lane that started it.
package keylane
