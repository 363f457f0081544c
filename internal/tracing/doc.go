// Package tracing makes keylane's OpenTelemetry spans: a client's send
// spans (Client: Submit, Call, SubmitMany) and a worker's spans of each
// job (Worker, JobTrace: process, queue, run, commit, and one commit span
// per group commit). What the spans are, their attributes and why they
// are shaped so is written down for users in the root package's doc.go
// ("Tracing"); this package is how.
//
// Each side is built from an explicit config (ClientConfig, WorkerConfig)
// that hands it what it must know of the rest of keylane as values and
// functions: whether a job still fits its size limit, how to tell a
// duplicate or a worker's failure from other errors, a partition's
// consumer name. It imports nothing of keylane but wire (header names).
// A job's spans read a Job of their own, the few fields they record.
//
// Off (no TracerProvider) NewClient and NewWorker return nil, and every
// method of a nil Client, Worker or JobTrace, and of the zero spans they
// then return, is a nil check: no header is written or read, nothing is
// allocated (TestOffIsANilCheck here; TestTracingOffAllocatesNothing in
// the root, through the engine's hooks).
//
// Failure cases:
//
//   - A trace context that would take a job past its size limit is left
//     out and the send span says so (keylane.trace_context_dropped):
//     tracing never makes a job fail (TestSendWritesItsContextUnlessTooLarge).
//   - A duplicate (the job was stored before, by its ID) is not an error
//     span (TestDuplicateIsNoFailure).
//   - A job's traceparent that is missing or does not parse makes its
//     process span a root span, never a failed job; a producer that
//     capitalises the header is honoured (headerCarrier;
//     TestTracingBadTraceparentIsIgnored in the root).
//   - No span outlives the run of the lane that started it: JobTrace.Leave
//     ends what a run left open, as not acked or requeued
//     (TestTracingFailedGroupWrite in the root).
//   - A failed group write is one commit span with an error status
//     (TestTracingFailedGroupWrite).
//
// A JobTrace is touched only by its lane's runner goroutine; Client and
// Worker are safe for concurrent use.
package tracing
