package statestore

import (
	"strings"
	"testing"

	"github.com/keylane/keylane/internal/natstest"
	"github.com/nats-io/nats.go/jetstream"
)

// TestCasPutSaysNatsOnce: a compare-and-set write the bucket refuses
// (a value over its limit, a stale revision, a key that exists) reads
// "nats: …" once, and still matches the conflict sentinels.
func TestCasPutSaysNatsOnce(t *testing.T) {
	srv := natstest.Start(t)
	js, err := jetstream.New(natstest.Connect(t, srv))
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.CreateKeyValue(ctx(t), jetstream.KeyValueConfig{Bucket: "CAS", MaxValueSize: 64, History: 1})
	if err != nil {
		t.Fatal(err)
	}
	rev, err := Put(ctx(t), kv, "k", 0, []byte("v"))
	if err != nil {
		t.Fatal(err)
	}
	big := []byte(strings.Repeat("x", 100))
	for _, tc := range []struct {
		name     string
		rev      uint64
		value    []byte
		conflict bool
	}{
		{"create over the value limit", 0, big, false},
		{"update over the value limit", rev, big, false},
		{"create of a key that exists", 0, []byte("v"), true},
		{"update from a stale revision", rev + 7, []byte("v"), true},
	} {
		k := "k"
		if tc.name == "create over the value limit" {
			k = "fresh"
		}
		_, err := Put(ctx(t), kv, k, tc.rev, tc.value)
		if err == nil {
			t.Errorf("%s: stored", tc.name)
			continue
		}
		t.Logf("%s: %v", tc.name, err)
		if strings.Contains(err.Error(), "nats: nats:") {
			t.Errorf("%s: %q says nats twice", tc.name, err)
		}
		if Conflict(err) != tc.conflict {
			t.Errorf("%s: Conflict(%v) = %v, want %v", tc.name, err, !tc.conflict, tc.conflict)
		}
	}
}
