package keylane

import (
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// The namespace room's names the tests of this package use, from
// internal/namespace.

// consumerConfig is the durable pull consumer of one partition
// (namespace.Topology.ConsumerConfig).
func (t *Topology) consumerConfig(p int, ackWait time.Duration, maxAckPending int) jetstream.ConsumerConfig {
	return t.ConsumerConfig(p, ackWait, maxAckPending)
}
