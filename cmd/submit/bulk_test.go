package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/keylane/keylane"
	"github.com/keylane/keylane/internal/natstest"
	"github.com/keylane/keylane/wire"
	"github.com/nats-io/nats.go/jetstream"
)

// TestBulkCommand: `submit bulk` stores every good line, refuses each
// bad one by its line number with nothing stored for it, says how many
// were stored, and draws its bar only when forced.
func TestBulkCommand(t *testing.T) {
	srv := natstest.Start(t)
	nc := natstest.Connect(t, srv)
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := keylane.Setup(ctx, js, keylane.TopologyConfig{Namespace: "bulk", Partitions: 4}); err != nil {
		t.Fatal(err)
	}
	lines := []string{
		`{"key":"sku:1","payload":"buy 1","id":"o-1"}`,
		`{"key":"sku:2","payload":{"qty":2},"id":"o-2","type":"buy"}`,
		`{"key":"sku:1","payload":"buy 1"`,                       // 3: cut short
		``,                                                       // blank: skipped
		`{"payload":"no key","id":"o-5"}`,                        // 5: no key
		`{"key":"sku:3","paylaod":"typo"}`,                       // 6: unknown field
		`{"key":"` + strings.Repeat("k", 2000) + `","id":"o-7"}`, // 7: key too long, refused by the client
		`{"key":"sku:3","id":"o-8"}`,
		`{"key":"sku:4","payload":null,"id":"o-9"}`,
	}
	file := filepath.Join(t.TempDir(), "jobs.jsonl")
	if err := os.WriteFile(file, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	err := run(ctx, []string{"bulk", "--nats", srv.ClientURL(), "--namespace", "bulk", "--file", file, "--progress"}, &out, &errOut)
	if err == nil || !strings.Contains(err.Error(), "4 of 8 lines refused") {
		t.Fatalf("bulk: %v, want 4 of 8 lines refused", err)
	}
	if !strings.Contains(out.String(), "stored 4 of 8 jobs read; 4 refused") {
		t.Fatalf("bulk's summary:\n%s", out.String())
	}
	for _, want := range []string{"line 3: not a job", `line 5: no "key"`, `line 6: not a job: json: unknown field "paylaod"`, "line 7 (job o-7):"} {
		if !strings.Contains(errOut.String(), want) {
			t.Errorf("stderr lacks %q:\n%s", want, errOut.String())
		}
	}
	if final := errOut.String()[strings.LastIndex(errOut.String(), "\x1b[J")+1:]; !strings.Contains(final, "jobs") || !strings.Contains(final, "8 / 8") || !strings.Contains(final, "done") {
		t.Errorf("the bar's final state: %q", final)
	}
	stored := map[string]string{}
	for _, j := range storedJobs(t, js) {
		stored[j.Key] = string(j.Payload)
	}
	want := map[string]string{"sku:1": "buy 1", "sku:2": `{"qty":2}`, "sku:3": "", "sku:4": ""}
	if len(stored) != len(want) {
		t.Fatalf("stored %v, want %v", stored, want)
	}
	for k, v := range want {
		if got, ok := stored[k]; !ok || got != v {
			t.Errorf("key %s: stored %q (%v), want %q", k, got, ok, v)
		}
	}

	// Again, without --progress and all good: no bar on a stderr that is
	// not a terminal, and the same IDs store nothing twice.
	good := filepath.Join(t.TempDir(), "good.jsonl")
	if err := os.WriteFile(good, []byte(lines[0]+"\n"+lines[1]+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	errOut.Reset()
	if err := run(ctx, []string{"bulk", "--nats", srv.ClientURL(), "--namespace", "bulk", "--file", good}, &out, &errOut); err != nil {
		t.Fatalf("bulk of good lines: %v\n%s", err, errOut.String())
	}
	if errOut.Len() != 0 || !strings.Contains(out.String(), "stored 2 of 2 jobs read; 0 refused") {
		t.Fatalf("stdout %q, stderr %q", out.String(), errOut.String())
	}
	// The same IDs again are stored again (every job travels in a batch
	// message, which the server de-duplicates by the batch only) and
	// marked as their callers': the worker looks them up and answers them
	// from the first's outcome, never running them twice.
	jobs := storedJobs(t, js)
	if len(jobs) != 6 {
		t.Fatalf("%d jobs in the stream after the same IDs again, want 6", len(jobs))
	}
	for _, j := range jobs[4:] {
		if (j.ID != "o-1" && j.ID != "o-2") || !j.Idempotent {
			t.Errorf("job again %+v: want o-1 or o-2 marked as its caller's ID", j)
		}
	}
}

// storedJobs returns the jobs in the bulk namespace's stream, in order:
// those of batch messages as their bodies hold them.
func storedJobs(t *testing.T, js jetstream.JetStream) []wire.BatchJob {
	t.Helper()
	var jobs []wire.BatchJob
	for _, m := range natstest.StreamMsgs(t, js, "BULK_JOBS") {
		if m.Header.Get(wire.HeaderBatch) == "" {
			jobs = append(jobs, wire.BatchJob{Key: m.Header.Get(keylane.HeaderKey), ID: m.Header.Get(keylane.HeaderJobID), Payload: m.Data})
			continue
		}
		js, err := wire.DecodeBatch(m.Data)
		if err != nil {
			t.Fatalf("a stored batch: %v", err)
		}
		jobs = append(jobs, js...)
	}
	return jobs
}
