package keylane

import (
	"testing"

	"github.com/keylane/keylane/internal/tenure"
)

// TestRestartCountersLeaveNothingInTheStateBucket: counting a redelivered
// job's starts and forgetting them once it finished must not leave a purge
// marker behind for ever in the state bucket, which has no TTL.
func TestRestartCountersLeaveNothingInTheStateBucket(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	w := e.worker("w", nil, func(c *WorkerConfig) { c.Handler, c.Reducer = nil, countReducer })
	e.waitOwned(w)
	o := tenure.NewForTest(ctx(t), w.tenureConfig(0, nil))
	for i := range 20 {
		id := "job-" + string(rune('a'+i))
		if _, err := o.CountStart(id); err != nil {
			t.Fatal(err)
		}
		o.ForgetStarts(id)
	}
	if n := e.streamMsgs("KV_" + e.topo.Names.State()); n != 0 {
		t.Fatalf("state bucket holds %d messages after every counter was forgotten", n)
	}
}
