package keylanepg_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/keylane/keylane"
	"github.com/keylane/keylane/internal/natstest"
	keylanepg "github.com/keylane/keylane/pg"
)

// TestWorkerSIGKILLedBetweenCommitAndAck: a worker in a child process
// (this test binary, TestHelperWorkerProcess) sells a SKU; right after its
// first transaction with a sale commits, and before it replies or acks,
// it says so on stdout and the test SIGKILLs it. A worker in this process
// then takes the partition over and gets the jobs redelivered: each must
// be answered from the database's record, never applied again, and every
// buyer told what the record says. Fails if a redelivered job is applied
// twice (history: "applied twice"; the order row's UNIQUE job_id would
// also refuse it), if the record's answers differ from the buyers', or if
// none of the killed worker's commits came back as Recorded. Run for both
// kinds of handler; the child learns its kind from KEYLANEPG_KIND.
func TestWorkerSIGKILLedBetweenCommitAndAck(t *testing.T) {
	forKinds(t, testWorkerSIGKILLedBetweenCommitAndAck)
}

func testWorkerSIGKILLedBetweenCommitAndAck(t *testing.T, kind string) {
	pg, db := startShop(t, 8)
	s := natstest.Start(t)
	setStock(t, db, "k", 50)
	child := exec.Command(os.Args[0], "-test.run=^TestHelperWorkerProcess$")
	child.Env = append(os.Environ(), "KEYLANEPG_HELPER=1", "KEYLANEPG_KIND="+kind, "KEYLANEPG_NATS="+s.ClientURL(), "KEYLANEPG_PG="+pg.URL("postgres", "postgres"))
	stdout, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	child.Stderr = os.Stderr
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	killed := false
	t.Cleanup(func() {
		if !killed {
			_ = child.Process.Kill()
			_ = child.Wait()
		}
	})
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	wait := func(prefix string) string {
		t.Helper()
		timeout := time.After(time.Minute)
		for {
			select {
			case l, ok := <-lines:
				if !ok {
					t.Fatalf("the child worker ended before %q", prefix)
				}
				if strings.HasPrefix(l, prefix) {
					return l
				}
			case <-timeout:
				t.Fatalf("no %q from the child worker", prefix)
			}
		}
	}
	wait("READY")

	c := newClient(t, s.ClientURL())
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	b := newBuyers()
	done := make(chan struct{})
	go func() {
		defer close(done)
		b.buy(ctx, c, 16, "kill", sale(40, "k"))
	}()
	var committed int64
	if line := wait("COMMITTED"); func() bool { n, err := fmt.Sscanf(line, "COMMITTED %d", &committed); return n != 1 || err != nil }() {
		t.Fatalf("the child's COMMITTED line %q has no count: the check below could not fail", line)
	}
	if err := child.Process.Kill(); err != nil { // SIGKILL
		t.Fatal(err)
	}
	_ = child.Wait()
	killed = true
	go func() {
		for range lines {
		}
	}()

	hist := newHistory()
	var recorded atomic.Int64
	app := shopApplier(kind, db, hist)
	app.after = func(g keylane.JobGroup, out []keylanepg.Outcome, err error) {
		for _, o := range out {
			if o.Status == keylanepg.Recorded {
				recorded.Add(1)
			}
		}
	}
	startWorker(t, s.ClientURL(), helperTopo, app, "b")
	<-done
	b.check(t, db, hist, []string{"k"}, 50)
	t.Logf("the killed worker committed %d jobs; its successor answered %d from the record", committed, recorded.Load())
	if recorded.Load() < committed {
		t.Errorf("%d jobs answered from the record, the killed worker had committed %d", recorded.Load(), committed)
	}
}

var helperTopo = keylane.TopologyConfig{Namespace: ns, Partitions: 1, LeaseTTL: time.Second}

// TestHelperWorkerProcess is the child of TestWorkerSIGKILLedBetweenCommitAndAck:
// a worker that, once a transaction with a sale has committed, prints
// COMMITTED n and stops there, before any reply or ack, to be SIGKILLed.
func TestHelperWorkerProcess(t *testing.T) {
	if os.Getenv("KEYLANEPG_HELPER") != "1" {
		t.Skip("run by TestWorkerSIGKILLedBetweenCommitAndAck")
	}
	db, err := pgxpool.New(context.Background(), os.Getenv("KEYLANEPG_PG"))
	if err != nil {
		t.Fatal(err)
	}
	app := shopApplier(os.Getenv("KEYLANEPG_KIND"), db, newHistory())
	app.after = func(g keylane.JobGroup, out []keylanepg.Outcome, err error) {
		n := 0
		for _, o := range out {
			if o.Status == keylanepg.Applied {
				n++
			}
		}
		if err == nil && n > 0 {
			fmt.Printf("COMMITTED %d\n", n)
			select {} // killed here: committed, nothing replied or acked
		}
	}
	w, _ := startWorker(t, os.Getenv("KEYLANEPG_NATS"), helperTopo, app, "a")
	owned(t, 1, w)
	fmt.Println("READY")
	select {}
}
