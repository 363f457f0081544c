package statuspage_test

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/natstest"
	"github.com/keylane/keylane/internal/testwait"
	"github.com/keylane/keylane/statuspage"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func get(t *testing.T, method, url string) (int, string, time.Duration) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b), time.Since(start)
}

// The JSON view holds what the page shows: owners, backlog, dead letters
// with their error, and no payload.
func TestJSON(t *testing.T) {
	s := newScene(t)
	hs := serve(t, s.js, statuspage.Config{Namespace: ns, Worker: workerID})
	code, body, _ := get(t, http.MethodGet, hs.URL+"/keylane/status.json")
	if code != http.StatusOK {
		t.Fatalf("status.json: %d %s", code, body)
	}
	var p statuspage.Page
	if err := json.Unmarshal([]byte(body), &p); err != nil {
		t.Fatalf("status.json is not a Page: %v\n%s", err, body)
	}
	if p.Error != "" || p.Status == nil || p.Worker != workerID || p.Status.Namespace != ns || len(p.Status.Partition) != partitions {
		t.Fatalf("status.json: %s", body)
	}
	for _, ps := range p.Status.Partition {
		if ps.Owner != workerID || ps.Fence == 0 {
			t.Fatalf("partition %d: owner %q fence %d, want %s", ps.Partition, ps.Owner, ps.Fence, workerID)
		}
	}
	// Each worker says where it runs and its build (its member entry).
	host, _ := os.Hostname()
	if len(p.Workers) != 1 || p.Workers[0].ID != workerID || p.Workers[0].Host != host || p.Workers[0].Version == "" {
		t.Fatalf("workers %+v: want %s on host %q with a version", p.Workers, workerID, host)
	}
	if got := p.Status.Partition[blocked].Pending; got != backlog {
		t.Fatalf("partition %d pending %d, want %d", blocked, got, backlog)
	}
	if p.Status.DeadLetters != 1 || len(p.DeadLetters) != 1 {
		t.Fatalf("dead letters: count %d, listed %d; want 1", p.Status.DeadLetters, len(p.DeadLetters))
	}
	d := p.DeadLetters[0]
	if d.JobID != s.poisonID || d.Key != s.poisonKey || !strings.Contains(d.Error, declined) || d.Worker != workerID || d.Partition != poisoned {
		t.Fatalf("dead letter %+v", d)
	}
	if d.Payload != nil || strings.Contains(body, "cG9pc29u") { // base64 of "poison"
		t.Fatalf("status.json shows a payload: %s", body)
	}
}

// A NATS that takes requests and never answers gives, within the page's
// Timeout, a 503 page that says so; not a hang until keylane's own
// request timeout (5s).
func TestSilentNATSShowsAnErrorInTime(t *testing.T) {
	hs := serve(t, silentJS(t), statuspage.Config{Namespace: ns, Timeout: 300 * time.Millisecond})
	for _, path := range []string{"/keylane/", "/keylane/status.json"} {
		code, body, took := get(t, http.MethodGet, hs.URL+path)
		if took > 3*time.Second {
			t.Fatalf("%s took %s with a Timeout of 300ms", path, took)
		}
		if code != http.StatusServiceUnavailable || !strings.Contains(body, "NATS gave no answer within 300ms") || !strings.Contains(body, "namespace "+ns) {
			t.Fatalf("%s: %d, want 503 saying NATS gave no answer within 300ms:\n%s", path, code, body)
		}
	}
}

// silentJS is a JetStream API nobody answers: requests go out, no reply
// comes.
func silentJS(t *testing.T) jetstream.JetStream {
	t.Helper()
	nc := natstest.Connect(t, natstest.Start(t))
	sub, err := nc.Subscribe("silent.API.>", func(*nats.Msg) {})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	js, err := jetstream.NewWithAPIPrefix(nc, "silent.API")
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// A connection that is down gives a page that says so at once.
func TestNATSDownShowsAnError(t *testing.T) {
	srv := natstest.Start(t)
	nc := natstest.Connect(t, srv)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	// A request sent just before the client noticed the server went is
	// cut by Timeout; those after say the connection is down, at once.
	hs := serve(t, js, statuspage.Config{Namespace: ns, MaxAge: time.Millisecond, Timeout: time.Second})
	code, body, _ := get(t, http.MethodGet, hs.URL+"/keylane/")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "no jobs stream for namespace") {
		// No namespace was made: Inspect's error, on the page.
		t.Fatalf("a namespace that does not exist: %d\n%s", code, body)
	}
	srv.Shutdown()
	srv.WaitForShutdown()
	testwait.Eventually(t, 10*time.Second, "the page says the connection is down", func() bool {
		code, body, took := get(t, http.MethodGet, hs.URL+"/keylane/")
		if took > 3*time.Second {
			t.Fatalf("the page took %s with NATS down and a Timeout of 1s", took)
		}
		return code == http.StatusServiceUnavailable && strings.Contains(body, "not connected to NATS")
	})
}

func TestRoutesAndConfig(t *testing.T) {
	srv := natstest.Start(t)
	js, err := jetstream.New(natstest.Connect(t, srv))
	if err != nil {
		t.Fatal(err)
	}
	hs := serve(t, js, statuspage.Config{Namespace: ns})
	for _, c := range []struct {
		method, path string
		code         int
	}{
		{http.MethodGet, "/keylane/nope", http.StatusNotFound},
		{http.MethodPost, "/keylane/", http.StatusMethodNotAllowed},
		{http.MethodDelete, "/keylane/status.json", http.StatusMethodNotAllowed},
	} {
		if code, body, _ := get(t, c.method, hs.URL+c.path); code != c.code {
			t.Errorf("%s %s: %d %s, want %d", c.method, c.path, code, body, c.code)
		}
	}
	for name, c := range map[string]struct {
		js  jetstream.JetStream
		cfg statuspage.Config
	}{
		"nil JetStream":        {nil, statuspage.Config{}},
		"negative Timeout":     {js, statuspage.Config{Timeout: -time.Second}},
		"negative MaxAge":      {js, statuspage.Config{MaxAge: -time.Second}},
		"negative DeadLetters": {js, statuspage.Config{DeadLetters: -1}},
		"negative MaxLookups":  {js, statuspage.Config{MaxLookups: -1}},
	} {
		if h, err := statuspage.Handler(c.js, c.cfg); err == nil || h != nil {
			t.Errorf("%s: Handler returned %v, %v; want an error and no handler", name, h, err)
		}
	}
}
