package nodeclient_test

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/keylane/keylane/partition"
	"github.com/keylane/keylane/wire"
)

// TestNodeBatchBodiesAreGos has the Node client build batch messages
// (scripts/encodebatch.ts: its own buildJob, batchJobOf and buildBatch)
// for batches the shared vectors (testdata/conformance/batches.json) do
// not hold: jobs with a caller's ID (the idempotent flag) alone and among
// generated ones, a lone job of each kind as the client sends it, empty
// fields, multi-valued and empty header values, a 1024-byte key, a
// payload whose length takes a three-byte uvarint, and 130 jobs (a
// two-byte count). Each body must be wire.EncodeBatch's byte for byte, and
// wire.Rules.ParseBatch must accept the message and every job in it.
func TestNodeBatchBodiesAreGos(t *testing.T) {
	node, npm := needNode(t)
	build(t, npm)
	const ns, n = "shop", 8
	keyOf := func(p int, prefix string) string {
		for i := 0; ; i++ {
			if k := fmt.Sprintf("%s%d", prefix, i); partition.Of(k, n) == p {
				return k
			}
		}
	}
	type job struct {
		Key      string              `json:"key"`
		ID       string              `json:"id"`
		Explicit bool                `json:"explicit"`
		Type     string              `json:"type"`
		Reply    string              `json:"reply"`
		Call     bool                `json:"call"`
		Headers  map[string][]string `json:"headers"`
		Payload  string              `json:"payload_hex"`
	}
	type batch struct {
		Namespace   string `json:"namespace"`
		Partitions  int    `json:"partitions"`
		Shards      int    `json:"shards"`
		ReplyPrefix string `json:"reply_prefix"`
		Partition   int    `json:"partition"`
		BatchID     string `json:"batch_id"`
		Jobs        []job  `json:"jobs"`
	}
	const b1, b2, b3, b4, b5 = "Gj2Qhk3TYhYAmoxTQJcHq0", "xK9mPq2LrT5vWz8AbC3dE1", "AAAAAAAAAAAAAAAAAAAAAA", "zzzzzzzzzzzzzzzzzzzzzz", "0123456789abcdefABCDEF"
	many := make([]job, 130)
	for i := range many {
		many[i] = job{Key: keyOf(6, "m-"), ID: wire.BatchedJobID(b5, i), Payload: hex.EncodeToString([]byte{byte(i)})}
		if i%7 == 3 {
			many[i].ID, many[i].Explicit = fmt.Sprintf("order-%d", i), true
		}
	}
	in := []batch{
		// A lone submit as the client sends it: generated ID <batch>.0.
		{ns, n, 1, "_INBOX.", 0, b1, []job{{Key: keyOf(0, "k-"), ID: wire.BatchedJobID(b1, 0), Payload: hex.EncodeToString([]byte("buy 1"))}}},
		// A lone submit with a caller's ID: idempotent, a UTF-8 key.
		{ns, n, 1, "_INBOX.", partition.Of("日本語キー", n), b2, []job{{Key: "日本語キー", ID: "order-42", Explicit: true}}},
		// A lone call with a caller's ID, a type and headers: both flags.
		{ns, n, 1, "_INBOX.", 3, b3, []job{{Key: keyOf(3, "c-"), ID: "buy-42.1", Explicit: true, Type: "buy", Reply: "_INBOX.abc.7", Call: true,
			Headers: map[string][]string{"X-Tag": {"a", "b"}, "X-Empty": {""}, "traceparent": {"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}, "A": {"first"}}, Payload: "00ff"}}},
		// Mixed: a caller's ID between generated ones, a call without one.
		{"orders-eu", n, 4, "replies.", 5, b4, []job{
			{Key: keyOf(5, "e-"), ID: wire.BatchedJobID(b4, 0), Reply: "replies.x.-1", Call: true},
			{Key: keyOf(5, "e-"), ID: "eu-1", Explicit: true, Payload: "61"},
			{Key: keyOf(5, "f-"), ID: wire.BatchedJobID(b4, 2), Type: "t"},
		}},
		// Large fields: a 1024-byte key, a 70000-byte payload.
		{ns, n, 1, "_INBOX.", partition.Of(strings.Repeat("k", partition.MaxKeyLen), n), b1, []job{
			{Key: strings.Repeat("k", partition.MaxKeyLen), ID: "long", Explicit: true, Payload: hex.EncodeToString(bytes.Repeat([]byte{7}, 70000))},
		}},
		// 130 jobs: a two-byte count.
		{ns, n, 2, "_INBOX.", 6, b5, many},
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	input, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, node, "dist/scripts/encodebatch.js")
	cmd.Stdin = bytes.NewReader(input)
	cmd.Stderr = os.Stderr
	raw, err := cmd.Output()
	if err != nil {
		t.Fatalf("encodebatch.js: %v", err)
	}
	var out []struct {
		Subject string              `json:"subject"`
		Headers map[string][]string `json:"headers"`
		Body    string              `json:"body_hex"`
		Error   string              `json:"error"`
	}
	if err := json.Unmarshal(raw, &out); err != nil || len(out) != len(in) {
		t.Fatalf("encodebatch.js printed %d results (%v), want %d", len(out), err, len(in))
	}
	for i, b := range in {
		got := out[i]
		if got.Error != "" {
			t.Errorf("batch %d: the Node client refused it: %s", i, got.Error)
			continue
		}
		jobs := make([]wire.BatchJob, len(b.Jobs))
		for k, j := range b.Jobs {
			payload, _ := hex.DecodeString(j.Payload)
			jobs[k] = wire.BatchJob{Key: j.Key, ID: j.ID, Type: j.Type, Reply: j.Reply, KeepOutcome: j.Call, Idempotent: j.Explicit, Header: j.Headers, Payload: payload}
		}
		want, err := wire.EncodeBatch(jobs)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := hex.DecodeString(got.Body)
		if !bytes.Equal(body, want) {
			t.Errorf("batch %d: the Node client's body\n%x\nis not wire.EncodeBatch's\n%x", i, body, want)
			continue
		}
		wantSubject := wire.BatchSubject(b.Namespace, b.Partition)
		if got.Subject != wantSubject {
			t.Errorf("batch %d: subject %q, want %q", i, got.Subject, wantSubject)
		}
		if names := slices.Sorted(maps.Keys(got.Headers)); !slices.Equal(names, []string{"Keylane-Batch", "Keylane-Batch-Jobs", "Keylane-Partitions", "Nats-Expected-Stream", "Nats-Msg-Id"}) {
			t.Errorf("batch %d: headers %v", i, got.Headers)
		}
		rules := wire.Rules{Namespace: b.Namespace, Partition: b.Partition, Partitions: b.Partitions, ReplyPrefix: b.ReplyPrefix}
		es, err := rules.ParseBatch(got.Subject, got.Headers, body)
		if err != nil {
			t.Errorf("batch %d refused whole: %v", i, err)
			continue
		}
		for k, e := range es {
			if e.Err != nil {
				t.Errorf("batch %d job %d refused: %v", i, k, e.Err)
			}
			if e.Job.ID != b.Jobs[k].ID || e.Job.Idempotent != b.Jobs[k].Explicit || e.Job.KeepOutcome != b.Jobs[k].Call {
				t.Errorf("batch %d job %d read as %+v", i, k, e.Job)
			}
		}
	}
}
