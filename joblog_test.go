package keylane

import (
	"context"
	"errors"
	"log/slog"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/testwait"
)

// TestJobEventsAtDebug: at DEBUG a worker logs each job's events (received
// with its key, sequence and delivery count; ran with its attempt and
// duration; committed with its group size; acked; a retry at WARN); at
// INFO none of them.
func TestJobEventsAtDebug(t *testing.T) {
	events := []string{"job received", "job ran", "jobs committed", "job acked"}
	for _, level := range []slog.Level{slog.LevelDebug, slog.LevelInfo} {
		t.Run(level.String(), func(t *testing.T) {
			e := newEnv(t, TopologyConfig{Partitions: 2})
			var buf syncBuffer
			var failed atomic.Bool
			e.worker("wa", nil, func(c *WorkerConfig) {
				c.Handler = nil
				c.Reducer = ReducerFunc(func(_ context.Context, job Job, state []byte) ([]byte, []byte, error) {
					if string(job.Payload) == "fail once" && failed.CompareAndSwap(false, true) {
						return nil, nil, errors.New("card reader busy")
					}
					return append(state, job.Payload...), nil, nil
				})
				c.Logger = slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: level}))
			})
			if _, err := e.client.Call(ctx(t), "sku:7", []byte("buy")); err != nil {
				t.Fatal(err)
			}
			if _, err := e.client.Call(ctx(t), "sku:8", []byte("fail once")); err != nil {
				t.Fatal(err)
			}
			if level == slog.LevelInfo {
				// The acks follow the replies: wait until both jobs left the
				// stream, then no event may have been logged.
				testwait.Eventually(t, 10*time.Second, "jobs acked", func() bool { return e.streamMsgs(e.topo.Names.Jobs()) == 0 })
				for _, ev := range events {
					if strings.Contains(buf.String(), ev) {
						t.Errorf("at INFO the log says %q:\n%s", ev, buf.String())
					}
				}
				return
			}
			want := []*regexp.Regexp{
				regexp.MustCompile(`level=DEBUG msg="job received" .*partition=\d fence=\d+ job_id=\S+ key=sku:7 seq=1 delivered=1 maybe_dup=false`),
				regexp.MustCompile(`level=DEBUG msg="job ran" .*key=sku:7 seq=1 attempt=1 took=[0-9.]+[µnm]?s\n`),
				regexp.MustCompile(`level=DEBUG msg="jobs committed" .*key=sku:7 group=1 first_seq=1 last_seq=1`),
				regexp.MustCompile(`level=DEBUG msg="job acked" .*key=sku:7 seq=1`),
				regexp.MustCompile(`level=DEBUG msg="job ran" .*key=sku:8 seq=2 attempt=1 took=\S+ err="card reader busy"`),
				regexp.MustCompile(`level=WARN msg="job failed; retrying" .*key=sku:8 attempt=1 err="card reader busy"`),
				regexp.MustCompile(`level=DEBUG msg="job ran" .*key=sku:8 seq=2 attempt=2 took=\S+\n`),
				regexp.MustCompile(`level=DEBUG msg="job acked" .*key=sku:8 seq=2`),
			}
			testwait.Eventually(t, 10*time.Second, "jobs acked", func() bool { return e.streamMsgs(e.topo.Names.Jobs()) == 0 })
			for _, re := range want {
				if !re.MatchString(buf.String()) {
					t.Errorf("the DEBUG log has no line like %s", re)
				}
			}
			if t.Failed() {
				t.Logf("log:\n%s", buf.String())
			}
		})
	}
}
