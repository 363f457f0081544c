package lease_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/keylane/keylane/lease"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

const (
	helperEnvURL = "LEASE_HELPER_URL"
	helperEnvKey = "LEASE_HELPER_KEY"
)

// TestHelperProcess is the child of TestPausedHolderDistrustsItself: it
// takes a lease, prints its fence, then every 50ms prints what it would
// decide before an ack, until it is killed.
func TestHelperProcess(t *testing.T) {
	url := os.Getenv(helperEnvURL)
	if url == "" {
		t.Skip("helper process for TestPausedHolderDistrustsItself")
	}
	ctx := context.Background()
	nc, err := nats.Connect(url)
	if err != nil {
		fmt.Println("error", err)
		os.Exit(2)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		fmt.Println("error", err)
		os.Exit(2)
	}
	kv, err := js.KeyValue(ctx, bucketName)
	if err != nil {
		fmt.Println("error", err)
		os.Exit(2)
	}
	l, err := lease.Acquire(ctx, kv, os.Getenv(helperEnvKey), lease.Config{Holder: "child"})
	if err != nil {
		fmt.Println("error", err)
		os.Exit(2)
	}
	fmt.Println("fence", l.Fence())
	for {
		// Read the clock before deciding, so the parent can tell a
		// decision made after the resume from one made before the stop.
		now := time.Now().UnixNano()
		trusted := l.Trusted()
		err := l.Err()
		fmt.Printf("status %d %t %t %t\n", now, trusted, errors.Is(err, lease.ErrExpired), errors.Is(err, lease.ErrLost))
		time.Sleep(50 * time.Millisecond)
	}
}

type childStatus struct {
	at                     time.Time
	trusted, expired, lost bool
}

// TestPausedHolderDistrustsItself stops a lease holder (a child process)
// with SIGSTOP for longer than the TTL, lets a contender take the key, and
// resumes the holder: its very first decision after the resume must be
// "not trusted", before its watchdog had any chance to run.
func TestPausedHolderDistrustsItself(t *testing.T) {
	const ttl = time.Second
	e := newEnv(t, ttl)
	const key = "p.0"

	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1", "-test.timeout=2m")
	cmd.Env = append(os.Environ(), helperEnvURL+"="+e.srv.ClientURL(), helperEnvKey+"="+key)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	fences := make(chan uint64, 1)
	statuses := make(chan childStatus, 4096)
	var reader sync.WaitGroup
	reader.Go(func() {
		defer close(statuses)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			switch {
			case len(f) == 2 && f[0] == "fence":
				n, _ := strconv.ParseUint(f[1], 10, 64)
				fences <- n
			case len(f) == 5 && f[0] == "status":
				ns, _ := strconv.ParseInt(f[1], 10, 64)
				statuses <- childStatus{at: time.Unix(0, ns), trusted: f[2] == "true", expired: f[3] == "true", lost: f[4] == "true"}
			}
		}
	})
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		_ = cmd.Wait() // closes stdout, which ends the reader
		reader.Wait()
		if t.Failed() {
			t.Logf("child stderr:\n%s", stderr.String())
		}
	})

	var childFence uint64
	select {
	case childFence = <-fences:
	case <-time.After(10 * time.Second):
		t.Fatal("child did not acquire the lease")
	}
	// Until the stop it must say trusted.
	waitStatus(t, statuses, 5*time.Second, "a trusted status before the stop", func(s childStatus) bool { return s.trusted })

	stopped := time.Now()
	if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	// The stopped child cannot renew; the contender gets the key once the
	// server expires the child's entry, one TTL after its last renew.
	ctx, cancel := context.WithTimeout(t.Context(), 4*ttl)
	defer cancel()
	contender, err := lease.Campaign(ctx, e.kv, key, config(t, "contender"))
	if err != nil {
		t.Fatal(err)
	}
	cleanup(t, contender)
	if contender.Fence() <= childFence {
		t.Fatalf("contender's fence %d not above the child's %d", contender.Fence(), childFence)
	}
	resumed := time.Now()
	t.Logf("child stopped for %s; contender took over with fence %d (child had %d)", resumed.Sub(stopped), contender.Fence(), childFence)
	if err := cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}

	// Every decision the child makes after the resume, starting with the
	// first one, says "not trusted" and why.
	var after int
	deadline := time.After(5 * time.Second)
	for after < 5 {
		select {
		case s, ok := <-statuses:
			if !ok {
				t.Fatal("child exited")
			}
			if s.at.Before(resumed) {
				continue
			}
			if s.trusted || !(s.expired || s.lost) {
				t.Fatalf("child's status %s after the resume: trusted=%v expired=%v lost=%v while the contender holds the key",
					s.at.Sub(resumed), s.trusted, s.expired, s.lost)
			}
			if after == 0 {
				t.Logf("child's first status %s after the resume: trusted=%v expired=%v lost=%v", s.at.Sub(resumed), s.trusted, s.expired, s.lost)
			}
			after++
		case <-deadline:
			t.Fatalf("only %d statuses from the child after the resume", after)
		}
	}
	if !contender.Trusted() {
		t.Fatalf("contender lost its lease: %v", contender.Err())
	}
}

func waitStatus(t *testing.T, statuses <-chan childStatus, timeout time.Duration, msg string, cond func(childStatus) bool) {
	t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case s, ok := <-statuses:
			if !ok {
				t.Fatalf("child exited before %s", msg)
			}
			if cond(s) {
				return
			}
		case <-deadline:
			t.Fatalf("not within %s: %s", timeout, msg)
		}
	}
}
