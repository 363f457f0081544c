package keylane

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/testwait"
	"github.com/keylane/keylane/lease"
	"github.com/keylane/keylane/partition"
)

// TestInspect: Inspect reports the topology, the members, each
// partition's owner and fence, and the dead letters, as they are.
func TestInspect(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 2})
	st, err := Inspect(ctx(t), e.js, e.ns)
	if err != nil {
		t.Fatal(err)
	}
	if st.Partitions != 2 || st.Shards != 1 || len(st.Epochs) != 1 || st.Epochs[0] == 0 || len(st.Members) != 0 || st.DeadLetters != 0 {
		t.Fatalf("before any worker: %+v", st)
	}
	for _, p := range st.Partition {
		if p.Owner != "" {
			t.Fatalf("partition %d owned by %q before any worker", p.Partition, p.Owner)
		}
	}
	w := e.worker("wa", HandlerFunc(func(ctx context.Context, job Job) ([]byte, error) {
		if string(job.Payload) == "poison" {
			return nil, Permanent(context.Canceled)
		}
		return nil, nil
	}), nil)
	e.waitOwned(w)
	if _, err := e.client.Call(ctx(t), "k", []byte("poison")); err == nil {
		t.Fatal("the poison job succeeded")
	}
	testwait.Eventually(t, 10*time.Second, "Inspect shows wa owning both partitions and one dead letter", func() bool {
		st, err = Inspect(ctx(t), e.js, e.ns)
		if err != nil || st.DeadLetters != 1 || !slices.Equal(st.Members, []string{"wa"}) {
			return false
		}
		for _, p := range st.Partition {
			if p.Owner != "wa" || p.Fence == 0 || p.Since.IsZero() {
				return false
			}
		}
		return true
	})
	k := partition.Of("k", 2)
	if st.Partition[k].LastActive.IsZero() {
		t.Fatalf("partition %d ran a job but shows no activity: %+v", k, st.Partition[k])
	}
}

// TestInspectFenceIsTheJobsFence: the fence Inspect reports (keylane
// status, the status page, /status.json) is the tenure's, the one a job
// and a dead letter carry and the owner logs, also after the lease was
// renewed (each renew moves the entry's revision, never the fence).
func TestInspectFenceIsTheJobsFence(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	fences := make(chan uint64, 16)
	w := e.worker("wa", HandlerFunc(func(ctx context.Context, job Job) ([]byte, error) {
		fences <- job.Fence
		return nil, nil
	}), nil)
	e.waitOwned(w)
	if _, err := e.client.Call(ctx(t), "k", []byte("x")); err != nil {
		t.Fatal(err)
	}
	fence := <-fences
	testwait.Eventually(t, 10*time.Second, "the lease renewed since the job ran", func() bool {
		_, rev, err := lease.Read(ctx(t), e.topo.Leases, e.topo.Names.LeaseKey(0))
		return err == nil && rev > fence+1
	})
	st, err := Inspect(ctx(t), e.js, e.ns)
	if err != nil {
		t.Fatal(err)
	}
	if got := st.Partition[0]; got.Owner != "wa" || got.Fence != fence {
		t.Fatalf("Inspect: owner %q fence %d; want wa and the job's fence %d", got.Owner, got.Fence, fence)
	}
}
