package balance

import (
	"testing"
	"time"
)

func TestStuckKeyRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		p  int
		id string
	}{{0, "wa"}, {7, "worker-1"}, {1023, "w_b"}} {
		key := StuckKey(tc.p, tc.id)
		p, id, ok := parseStuckKey(key)
		if !ok || p != tc.p || id != tc.id {
			t.Errorf("parseStuckKey(%q) = %d, %q, %v; want %d, %q, true", key, p, id, ok, tc.p, tc.id)
		}
	}
}

// TestParseStuckKeyRefusesOtherKeys: a partition's lease (p.<p>) and
// malformed marks are not stuck marks.
func TestParseStuckKeyRefusesOtherKeys(t *testing.T) {
	for _, key := range []string{"p.3", "s.3", "s.3.", "s.x.wa", "s.-1.wa", "", "s."} {
		if p, id, ok := parseStuckKey(key); ok {
			t.Errorf("parseStuckKey(%q) = %d, %q, true; want not a stuck mark", key, p, id)
		}
	}
}

// TestNextBackoffStaysWithinItsBounds: from TTL/20 (10ms at least) up to
// the TTL, less up to half at random.
func TestNextBackoffStaysWithinItsBounds(t *testing.T) {
	const ttl = 2 * time.Second
	var d time.Duration
	for i := range 20 {
		d = nextBackoff(d, ttl)
		if d < ttl/40 || d > ttl {
			t.Fatalf("step %d: backoff %s outside [%s, %s]", i, d, ttl/40, ttl)
		}
	}
	if lo := nextBackoff(0, 10*time.Millisecond); lo < 5*time.Millisecond || lo > 10*time.Millisecond {
		t.Errorf("a short TTL's first backoff is %s; want within [5ms, 10ms]", lo)
	}
}
