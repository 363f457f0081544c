package partition

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/cespare/xxhash/v2"
)

func TestValidateKey(t *testing.T) {
	cases := []struct {
		name string
		key  string
		want error
	}{
		{"ok", "sku:123", nil},
		{"unicode", "siège:A7 — ünï", nil},
		{"spaces and dots", "a b.c>*", nil},
		{"max", strings.Repeat("k", MaxKeyLen), nil},
		{"empty", "", ErrEmptyKey},
		{"too long", strings.Repeat("k", MaxKeyLen+1), ErrKeyTooLong},
		{"not utf8", "\xff\xfe", ErrKeyNotUTF8},
		{"trailing space", "sku:7 ", ErrKeySpace},
		{"leading space", " sku:7", ErrKeySpace},
		{"trailing no-break space", "sku:7\u00a0", ErrKeySpace},
		{"tab inside", "sku\t7", ErrKeyControl},
		{"trailing tab", "sku:7\t", ErrKeyControl},
		{"DEL", "sku\x7f", ErrKeyControl},
		{"C1 control", "sku\u0085", ErrKeyControl},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := ValidateKey(tc.key)
			if !errors.Is(err, tc.want) {
				t.Fatalf("ValidateKey(%q) = %v, want %v", tc.key, err, tc.want)
			}
		})
	}
	if err := ValidateKey("a\r\nb"); err == nil {
		t.Fatal("a key with CRLF was accepted")
	}
}

func TestOfIsStableAndSpread(t *testing.T) {
	const n = 16
	counts := make([]int, n)
	for i := 0; i < 16000; i++ {
		k := fmt.Sprintf("sku:%d", i)
		p := Of(k, n)
		if p != Of(k, n) {
			t.Fatalf("Of(%q) not stable", k)
		}
		counts[p]++
	}
	for p, c := range counts {
		if c < 800 || c > 1200 {
			t.Errorf("partition %d got %d of 16000 keys; hash is badly skewed", p, c)
		}
	}
}

func TestSubjectRoundTrip(t *testing.T) {
	for p := 0; p < 100; p++ {
		key := fmt.Sprintf("seat:%d", p)
		got, token, err := FromSubject("keylane", Subject("keylane", p, key))
		if err != nil || got != p || token != KeyToken(key) {
			t.Fatalf("FromSubject(Subject(%d, %q)) = %d, %q, %v", p, key, got, token, err)
		}
	}
	for _, bad := range []string{"keylane.jobs.", "keylane.jobs.x", "keylane.jobs.01", "other.jobs.1", "keylane.jobs.-1", "keylane.jobs.1",
		"keylane.jobs.1.2", "keylane.jobs.1.0123456789abcdeF", "keylane.jobs.1.0123456789abcdef.x", "keylane.jobs.x.0123456789abcdef"} {
		if _, _, err := FromSubject("keylane", bad); err == nil {
			t.Errorf("FromSubject(%q) accepted", bad)
		}
	}
}

func TestKeyToken(t *testing.T) {
	seen := map[string]string{}
	for _, key := range []string{"sku:1", "sku:2", "siège 12", "a.b.c", "*", ">", "with space", strings.Repeat("x", MaxKeyLen)} {
		tok := KeyToken(key)
		if !validToken(tok) {
			t.Fatalf("KeyToken(%q) = %q, not 16 hex digits", key, tok)
		}
		if other, ok := seen[tok]; ok {
			t.Fatalf("KeyToken(%q) = KeyToken(%q)", key, other)
		}
		seen[tok] = key
		if tok != KeyToken(key) {
			t.Fatalf("KeyToken(%q) not stable", key)
		}
	}
	if got, want := KeyToken("sku:1"), fmt.Sprintf("%016x", xxhash.Sum64String("sku:1")); got != want {
		t.Fatalf("KeyToken = %s, want %s", got, want)
	}
}

func TestOwnerMovesOnlyWhatMust(t *testing.T) {
	const n = 240
	before := []string{"w1", "w2", "w3"}
	after := []string{"w1", "w2", "w3", "w4"}
	moved := 0
	for p := 0; p < n; p++ {
		a, b := Owner(p, before), Owner(p, after)
		if a != b {
			if b != "w4" {
				t.Fatalf("partition %d moved from %s to %s, not to the new member", p, a, b)
			}
			moved++
		}
	}
	// Expect about n/4 partitions to move to the new member.
	if moved < n/8 || moved > n/2 {
		t.Fatalf("%d of %d partitions moved when one of four members joined", moved, n)
	}
	if Owner(1, nil) != "" {
		t.Fatal("Owner of no members is not empty")
	}
}

func FuzzOf(f *testing.F) {
	f.Add("sku:1", 16)
	f.Add("siège", 1)
	f.Add("", 7)
	f.Fuzz(func(t *testing.T, key string, n int) {
		if ValidateCount(n) != nil {
			return
		}
		p := Of(key, n)
		if p < 0 || p >= n {
			t.Fatalf("Of(%q, %d) = %d out of range", key, n, p)
		}
		got, _, err := FromSubject("ns", Subject("ns", p, key))
		if err != nil || got != p {
			t.Fatalf("subject round trip of %d gave %d, %v", p, got, err)
		}
		if ValidateKey(key) == nil && Of(key, n) != p {
			t.Fatal("Of is not deterministic")
		}
	})
}
