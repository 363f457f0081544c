package namespace

import "testing"

func TestServerAtLeast(t *testing.T) {
	for _, tc := range []struct {
		v    string
		want bool
	}{
		{"2.12.0", true}, {"2.15.2", true}, {"2.12.0-beta.1", true}, {"3.0.0", true},
		{"2.11.9", false}, {"2.9.0", false}, {"1.99.0", false}, {"", false}, {"x.y", false}, {"2", false},
	} {
		if got := serverAtLeast(tc.v, 2, 12); got != tc.want {
			t.Errorf("serverAtLeast(%q, 2, 12) = %v, want %v", tc.v, got, tc.want)
		}
	}
}
