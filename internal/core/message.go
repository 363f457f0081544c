package core

import "github.com/nats-io/nats.go"

// MessageSize is roughly what a message takes against the server's
// max_payload: its body, subject and headers, and room for the server's
// own. The client checks a job against it before sending, the worker a
// dead letter before publishing it.
func MessageSize(m *nats.Msg) int64 {
	n := len(m.Data) + len(m.Subject) + 64
	for k, vs := range m.Header {
		for _, v := range vs {
			n += len(k) + len(v) + 4
		}
	}
	return int64(n)
}
