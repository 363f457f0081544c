package bench

import (
	"strings"
	"testing"
)

// TestKnobsRefuseWhatTheyCannotRead: a knob set to what it cannot read
// is refused before any run, never run as its default (an invalid
// KEYLANE_BENCH_PG_CORK used to fall back to the default cork).
func TestKnobsRefuseWhatTheyCannotRead(t *testing.T) {
	for k, v := range map[string]string{"KEYLANE_BENCH_PG_CORK": "1 ms", "KEYLANE_BENCH_PG_SHARDS": "four", "KEYLANE_BENCH_PG_PARTITIONS": "x"} {
		t.Setenv(k, v)
		if err := checkKnobs(); err == nil || !strings.Contains(err.Error(), k) {
			t.Errorf("%s=%q: checkKnobs = %v, want its refusal", k, v, err)
		}
		t.Setenv(k, "")
	}
	t.Setenv("KEYLANE_BENCH_PG_CORK", "300us")
	if err := checkKnobs(); err != nil {
		t.Errorf("KEYLANE_BENCH_PG_CORK=300us: %v", err)
	}
}
