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
package keylane
