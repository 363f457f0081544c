package keylane

import (
	"context"
	"errors"
	"strings"
	"testing"
)

// TestNamespaceOfAnotherSpellingKeepsOffAJobsStream: namespaces whose
// names differ only in '-' and '_' share object names (Names), so a
// worker or client of "a-b" (a typo) finds "a_b"'s jobs stream. Setup of
// "a-b" refuses it, leaving it as it is, and a client of "a-b" is refused
// at once (ErrNoTopology: "a-b" is not set up); "a_b" works on. Before,
// Setup of "a-b" rewrote the stream's subjects to a-b.jobs.*, so a_b's
// clients got no responders, and a client of "a-b" opened it and waited
// out every submit.
func TestNamespaceOfAnotherSpellingKeepsOffAJobsStream(t *testing.T) {
	e := newEnv(t, TopologyConfig{Namespace: "a_b", Partitions: 2})
	_, err := Setup(ctx(t), e.js, TopologyConfig{Namespace: "a-b", Partitions: 2, LeaseTTL: e.topo.Config.LeaseTTL})
	s, serr := e.js.Stream(ctx(t), e.topo.Names.Jobs())
	if serr != nil {
		t.Fatal(serr)
	}
	for _, subj := range s.CachedInfo().Config.Subjects {
		if !strings.HasPrefix(subj, "a_b.") {
			t.Fatalf("Setup of a-b (err %v) took a_b's jobs stream: its subjects are now %v", err, s.CachedInfo().Config.Subjects)
		}
	}
	if err == nil || !errors.Is(err, ErrNoTopology) || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Setup of a-b on a_b's jobs stream: %v; want ErrNoTopology at once, not tried again until its context ends", err)
	}
	t.Logf("Setup a-b: %v", err)
	if _, err := NewClient(ctx(t), e.nc, ClientConfig{Namespace: "a-b"}); !errors.Is(err, ErrNoTopology) {
		t.Fatalf("a client of a-b on a_b's jobs stream: %v, want ErrNoTopology", err)
	}
	if _, err := e.client.Submit(ctx(t), "k", []byte("x")); err != nil {
		t.Fatalf("a_b's client after a-b's attempts: %v", err)
	}
}
