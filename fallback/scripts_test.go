package fallback_test

import (
	"crypto/sha1"
	"encoding/hex"
	"testing"

	"github.com/keylane/keylane/fallback"
)

// TestScriptsLoad checks every embedded script compiles on a real server
// and that SCRIPT LOAD returns the sha1 EVALSHA will send.
func TestScriptsLoad(t *testing.T) {
	c := newClient(t, redisAddr)
	for _, s := range fallback.Scripts() {
		t.Run(s.Name, func(t *testing.T) {
			sum := sha1.Sum([]byte(s.Src))
			want := hex.EncodeToString(sum[:])
			if s.Hash != want {
				t.Fatalf("script hash %s, sha1 of source %s", s.Hash, want)
			}
			got, err := c.ScriptLoad(t.Context(), s.Src).Result()
			if err != nil {
				t.Fatalf("SCRIPT LOAD: %v", err)
			}
			if got != want {
				t.Fatalf("SCRIPT LOAD sha %s, want %s", got, want)
			}
		})
	}
}
