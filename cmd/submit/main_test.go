package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/testwait"
)

// TestSaleCommand runs the README's first command, smaller, and checks it
// reports a clean verdict, and that its forced progress bar ends at the
// purchases' total.
func TestSaleCommand(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out, errOut bytes.Buffer
	if err := run(ctx, []string{"sale", "-purchases", "1500", "-buyers", "32", "--progress"}, &out, &errOut); err != nil {
		t.Fatalf("sale: %v\n%s", err, out.String())
	}
	if final := errOut.String()[strings.LastIndex(errOut.String(), "\x1b[J")+1:]; !strings.Contains(final, "purchases") || !strings.Contains(final, "1500 / 1500") || !strings.Contains(final, "done") {
		t.Errorf("the bar's final state: %q", final)
	}
	for _, want := range []string{"oversell 0", "stock mismatches 0", "max concurrent runs per key 1", "verdict: OK", "jobs/s"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

func TestUsageErrors(t *testing.T) {
	var out bytes.Buffer
	for _, args := range [][]string{nil, {"nope"}, {"sale", "-skew", "0.5"}, {"call", "-key", "k"}, {"sale", "--batches", "maybe"}} {
		if err := run(context.Background(), args, &out, &out); err == nil {
			t.Errorf("run(%q) succeeded", args)
		}
	}
}

// sale --metrics serves the client's and the in-process workers' metrics
// while the sale runs.
func TestSaleServesMetrics(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	addr := fmt.Sprintf("127.0.0.1:%d", testwait.FreePort(t))
	done := make(chan error, 1)
	var out bytes.Buffer
	go func() {
		done <- run(ctx, []string{"sale", "-purchases", "2000", "-buyers", "16", "-hold", "2ms", "-metrics", addr}, &out, io.Discard)
	}()
	want := []string{
		`keylane_client_jobs_total{op="call",outcome="ok"}`,
		"keylane_client_request_seconds_bucket",
		"keylane_job_queue_wait_seconds_count",
		"keylane_group_jobs_sum",
		"keylane_partition_in_flight{partition=",
		"keylane_jobs_succeeded_total{worker=",
	}
	testwait.Until(t, time.Minute, "the sale's metrics are served", func() (string, bool) {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			return err.Error(), false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		for _, w := range want {
			if !strings.Contains(string(b), w) {
				return "no " + w + " in:\n" + string(b), false
			}
		}
		return "", true
	})
	if err := <-done; err != nil {
		t.Fatalf("sale: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "metrics: http://"+addr+"/metrics") {
		t.Errorf("the sale does not say where its metrics are:\n%s", out.String())
	}
}
