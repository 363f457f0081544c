package consoletest

import (
	"context"
	"fmt"
	"github.com/keylane/keylane/internal/proctest"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/keylane/keylane"
	"github.com/keylane/keylane/internal/natstest"
	"github.com/keylane/keylane/internal/testwait"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
)

const (
	ns         = "shop"
	partitions = 2
	leaseTTL   = 3 * time.Second
	// bad is how many jobs the scene dead-letters as bad commands.
	bad = 25
	// maxStock is the stock the redrive key is set to: its restock
	// overflows and is dead-lettered, after which the key is set to 0
	// and a redrive of it succeeds.
	maxStock   = "9223372036854775807"
	redriveKey = "sku:redrive"
	redriveID  = "restock-5"
)

// bins builds cmd/worker and cmd/keylane once per test binary.
var (
	binsOnce       sync.Once
	workerBin, cli string
	binsErr        error
	binsDir        string
)

func build(t *testing.T) {
	t.Helper()
	binsOnce.Do(func() {
		binsDir, binsErr = os.MkdirTemp("", "consoletest-bin")
		if binsErr != nil {
			return
		}
		workerBin, cli = filepath.Join(binsDir, "worker"), filepath.Join(binsDir, "keylane")
		for _, b := range []struct{ out, pkg string }{{workerBin, "github.com/keylane/keylane/cmd/worker"}, {cli, "github.com/keylane/keylane/cmd/keylane"}} {
			// Built in the root module, as shipped: with its go.mod.
			goBin, err := exec.LookPath("go")
			if err != nil {
				goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
			}
			cmd := exec.Command(goBin, "build", "-o", b.out, b.pkg)
			cmd.Dir = filepath.Join("..", "..")
			out, err := cmd.CombinedOutput()
			if err != nil {
				binsErr = fmt.Errorf("go build %s: %v\n%s", b.pkg, err, out)
				return
			}
		}
	})
	if binsErr != nil {
		t.Fatal(binsErr)
	}
}

// scene is a namespace with two worker processes (each serving its
// status page on its --metrics address) and bad+1 dead letters: bad
// commands bad-1..bad-25 of keys sku:1..sku:25 (sequences 1..25), then
// the overflowing restock of redriveKey (sequence 26), after which that
// key's stock is set to 0, so that a redrive of it succeeds.
type scene struct {
	srv     *server.Server
	js      jetstream.JetStream
	client  *keylane.Client
	workers []*proctest.Proc
	pages   []string // each worker's status page
}

func newScene(t *testing.T) *scene {
	t.Helper()
	build(t)
	s := &scene{srv: natstest.Start(t)}
	nc := natstest.Connect(t, s.srv)
	var err error
	if s.js, err = jetstream.New(nc); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		port := testwait.FreePort(t)
		s.workers = append(s.workers, proctest.Start(t, workerBin, "--nats", s.srv.ClientURL(), "--namespace", ns,
			"--partitions", strconv.Itoa(partitions), "--lease-ttl", leaseTTL.String(), "--id", fmt.Sprintf("w%d", i+1),
			"--max-deliver", "2", "--metrics", fmt.Sprintf("127.0.0.1:%d", port), "--log-level", "warn"))
		s.pages = append(s.pages, fmt.Sprintf("http://127.0.0.1:%d/", port))
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	testwait.Eventually(t, time.Minute, "both workers are members and every partition is owned", func() bool {
		st, err := keylane.Inspect(ctx, s.js, ns)
		if err != nil || len(st.Members) != 2 {
			return false
		}
		for _, p := range st.Partition {
			if p.Owner == "" {
				return false
			}
		}
		return true
	})
	s.client, err = keylane.NewClient(ctx, natstest.Connect(t, s.srv), keylane.ClientConfig{Namespace: ns})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.client.Close)
	for i := 1; i <= bad; i++ {
		if _, err := s.client.Call(ctx, fmt.Sprintf("sku:%d", i), []byte(fmt.Sprintf("bogus %d", i)), keylane.WithID(fmt.Sprintf("bad-%d", i))); err == nil {
			t.Fatalf("bad-%d succeeded", i)
		}
	}
	s.call(t, redriveKey, "set "+maxStock, "ok "+maxStock)
	if _, err := s.client.Call(ctx, redriveKey, []byte("restock 5"), keylane.WithID(redriveID)); err == nil {
		t.Fatal("the overflowing restock succeeded")
	}
	s.call(t, redriveKey, "set 0", "ok 0")
	testwait.Eventually(t, 30*time.Second, fmt.Sprintf("%d dead letters", bad+1), func() bool {
		st, err := keylane.Inspect(ctx, s.js, ns)
		return err == nil && st.DeadLetters == bad+1
	})
	return s
}

// call runs a job and wants its result.
func (s *scene) call(t *testing.T, key, payload, want string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	res, err := s.client.Call(ctx, key, []byte(payload))
	if err != nil || string(res) != want {
		t.Fatalf("%s %q: %q, %v; want %q", key, payload, res, err, want)
	}
}

// ui starts keylane ui on the scene's NATS with args and returns the
// URL it says it serves.
func (s *scene) ui(t *testing.T, args ...string) (string, *proctest.Proc) {
	t.Helper()
	p := proctest.Start(t, cli, append([]string{"ui", "--nats", s.srv.ClientURL(), "--namespace", ns, "--listen", "127.0.0.1:0"}, args...)...)
	re := regexp.MustCompile(`serving .* on (http://127\.0\.0\.1:[0-9]+/)`)
	return testwait.Until(t, 30*time.Second, "keylane ui says where it serves", func() (string, bool) {
		select {
		case <-p.Done():
			t.Fatalf("keylane ui exited: %s", p.Out.String())
		default:
		}
		m := re.FindStringSubmatch(p.Out.String())
		if m == nil {
			return p.Out.String(), false
		}
		return m[1], true
	}), p
}

// chromium returns the headless browser to run: $CHROMIUM, or chromium on
// the PATH. Without one the test is skipped, unless CI is set: CI must run
// it (scripts/test installs Debian's chromium).
func chromium(t *testing.T) string {
	t.Helper()
	if b := os.Getenv("CHROMIUM"); b != "" {
		return b
	}
	b, err := exec.LookPath("chromium")
	if err == nil {
		return b
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("CI=%s and no chromium on the PATH: scripts/test installs it (apt-get install chromium): %v", os.Getenv("CI"), err)
	}
	t.Skipf("no chromium on the PATH (apt-get install chromium; under CI this fails): %v", err)
	return ""
}

// browser starts a headless chromium driven through its DevTools
// protocol, with a viewport of width x height, for the test's length.
func browser(t *testing.T, width, height int64) context.Context {
	t.Helper()
	bin := chromium(t)
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(bin), chromedp.NoSandbox,
		chromedp.UserDataDir(t.TempDir()), chromedp.Flag("disable-dev-shm-usage", true), chromedp.WindowSize(int(width), int(height)))
	actx, cancel := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancel)
	bctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(cancel)
	if err := chromedp.Do(bctx, chromedp.EmulateViewport(width, height)); err != nil {
		t.Fatalf("starting chromium: %v", err)
	}
	return bctx
}

// run runs browser actions, bounded by a minute.
func run(t *testing.T, bctx context.Context, what string, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	value(t, bctx, what, chromedp.Steps(steps...))
}

// value runs a browser action that returns a value, bounded by a minute.
func value[T any](t *testing.T, bctx context.Context, what string, a chromedp.Action[T]) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(bctx, time.Minute)
	defer cancel()
	v, err := chromedp.Run(ctx, a)
	if err != nil {
		loc, _ := chromedp.Run(bctx, chromedp.Location())
		t.Fatalf("%s (at %s): %v", what, loc, err)
	}
	return v
}

// deadRows returns the ids of the dead-letter rows the page shows, in
// order.
func deadRows(t *testing.T, bctx context.Context) []string {
	t.Helper()
	return value(t, bctx, "reading the dead-letter rows", chromedp.Evaluate[[]string](`Array.from(document.querySelectorAll('#dead tbody tr')).map(r => r.id)`))
}

// seqRows returns the row ids of dead letters from..to, newest first.
func seqRows(from, to int) []string {
	var ids []string
	for s := to; s >= from; s-- {
		ids = append(ids, fmt.Sprintf("dead%d", s))
	}
	return ids
}

// httpGet returns the status code and body of a GET of url, or err.
func httpGet(ctx context.Context, url string) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// screenshot saves PNGs of the browser's page for a person to look at,
// in $STATUSPAGE_SCREENSHOT_DIR (a temporary directory when unset): what
// the screen shows as name, the whole page as name-full.png.
func screenshot(t *testing.T, bctx context.Context, name string) string {
	t.Helper()
	dir := os.Getenv("STATUSPAGE_SCREENSHOT_DIR")
	if dir == "" {
		dir = t.TempDir()
	}
	path := filepath.Join(dir, name)
	for _, s := range []struct {
		path string
		a    chromedp.Action[[]byte]
	}{{path, chromedp.CaptureScreenshot()}, {strings.TrimSuffix(path, ".png") + "-full.png", chromedp.FullScreenshot(100)}} {
		png := value(t, bctx, "taking a screenshot", s.a)
		if !strings.HasPrefix(string(png), "\x89PNG\r\n\x1a\n") || len(png) < 10_000 {
			t.Fatalf("the screenshot is not a PNG of a rendered page (%d bytes)", len(png))
		}
		if err := os.WriteFile(s.path, png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return path
}
