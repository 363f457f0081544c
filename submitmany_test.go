package keylane

import (
	"context"
	"fmt"
	"testing"
)

// TestSubmitManyNeverClaimsUnknownJobs: when ctx ends part-way, every job
// SubmitMany did not see stored carries an error; none is left looking
// like a success (Err nil) with or without an ID.
func TestSubmitManyNeverClaimsUnknownJobs(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	reqs := make([]Request, 5)
	for i := range reqs {
		reqs[i] = Request{Key: "k", Payload: []byte("x"), ID: fmt.Sprintf("m-%d", i)}
	}
	cctx, cancel := context.WithCancel(context.Background())
	cancel()
	out, err := e.client.SubmitMany(cctx, reqs)
	if err == nil {
		t.Fatal("SubmitMany with an ended context returned no error")
	}
	// Every job reported stored is in the stream, by its ID: a batch
	// message holds several jobs, so messages are not jobs.
	stored := map[string]bool{}
	for _, j := range storedJobs(t, e.js, e.topo.Names.Jobs()) {
		stored[j.ID] = true
	}
	for i, o := range out {
		if o.Err != nil {
			continue
		}
		if o.ID != reqs[i].ID {
			t.Errorf("out[%d] = %+v: a success without its job's ID", i, o)
		}
		if !stored[o.ID] {
			t.Errorf("out[%d] = %+v: reported stored, not in the stream (%d jobs there)", i, o, len(stored))
		}
	}
}
