package keylane

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/natstest"
	"github.com/nats-io/nats.go/jetstream"
)

// TestSetupRefusesOtherReplicas: a namespace created with R1 must not be
// silently accepted by a worker configured for R3 (it then looped on
// "consumer config replica count exceeds parent stream"); zero follows
// what exists.
func TestSetupRefusesOtherReplicas(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 2, Replicas: 1})
	cfg := e.topo.Config
	cfg.Replicas = 3
	if _, err := Setup(ctx(t), e.js, cfg); !errors.Is(err, ErrReplicasMismatch) {
		t.Fatalf("Setup R3 on an R1 namespace = %v, want ErrReplicasMismatch", err)
	}
	cfg.Replicas = 0
	topo, err := Setup(ctx(t), e.js, cfg)
	if err != nil || topo.Replicas != 1 {
		t.Fatalf("Setup with replicas 0 = %v, replicas %d; want the namespace's 1", err, topo.Replicas)
	}
}

// TestSetupByConcurrentCreators: many workers set up one namespace at
// once; all succeed and agree.
func TestSetupByConcurrentCreators(t *testing.T) {
	srv := natstest.Start(t)
	var wg sync.WaitGroup
	errs := make([]error, 8)
	n := make([]int, 8)
	for i := range errs {
		nc := natstest.Connect(t, srv)
		js, _ := jetstream.New(nc)
		wg.Go(func() {
			topo, err := Setup(ctx(t), js, TopologyConfig{Namespace: "race", LeaseTTL: time.Second})
			errs[i] = err
			if err == nil {
				n[i] = topo.Partitions
			}
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil || n[i] != 16 {
			t.Fatalf("creator %d: %v, %d partitions", i, err, n[i])
		}
	}
}
