package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/keylane/keylane/internal/natsflags"
	"github.com/keylane/keylane/metrics"
	"github.com/keylane/keylane/statuspage"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// defaultUIListen is where keylane ui serves unless told otherwise: this
// machine only.
const defaultUIListen = "127.0.0.1:7781"

// ui serves the console: the status page of a namespace (package
// statuspage) with the actions on dead letters, from any machine that
// reaches NATS, with the operator's credentials; the workers need not
// run. It serves until ctx ends (Ctrl-C).
func ui(ctx context.Context, args []string, out, errOut io.Writer) (err error) {
	fs := flag.NewFlagSet("ui", flag.ContinueOnError)
	var c conn
	c.register(fs)
	listen := fs.String("listen", defaultUIListen, "address to serve on; one that is not a loopback address is taken only when given here, and then anyone who reaches it acts with these NATS credentials")
	readOnly := fs.Bool("read-only", false, "serve without the actions (redrive, delete, purge)")
	timeout := fs.Duration("timeout", statuspage.DefaultTimeout, "bound of one reading of the namespace")
	if err := parseFlagsOnly(fs, args, errOut); err != nil {
		return err
	}
	given := false
	fs.Visit(func(f *flag.Flag) { given = given || f.Name == "listen" })
	host, _, err := net.SplitHostPort(*listen)
	if err != nil {
		return usagef("ui: --listen %q is not host:port: %v", *listen, err)
	}
	loopback := isLoopback(host)
	if !loopback && !given {
		return usagef("ui: %q is not a loopback address: give it with --listen to serve the console beyond this machine", *listen)
	}
	if *timeout <= 0 {
		return usagef("ui: --timeout must be positive")
	}
	if err := c.auth.UseContext(c.fs, "nats", &c.url); err != nil {
		return err
	}
	auth, err := c.auth.Options()
	if err != nil {
		return err
	}
	// A console outlives NATS outages: it reconnects for as long as it
	// runs, and its page says the connection is down meanwhile.
	nc, err := nats.Connect(c.url, append([]nats.Option{nats.Name("keylane-ui"), nats.Timeout(5 * time.Second), nats.MaxReconnects(-1)}, auth...)...)
	if err != nil {
		return fmt.Errorf("connect to %s: %w", natsflags.Redact(c.url), err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	page, err := statuspage.Handler(js, statuspage.Config{Namespace: c.namespace, Timeout: *timeout, Actions: !*readOnly})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("ui: %w", err)
	}
	// The namespaces' gauges, read from the server, for every namespace
	// these credentials can list: the exporter that keeps a namespace
	// whose workers all died (or whose workers may not list streams)
	// visible to the alert rules (docs/oncall.md).
	reg := prometheus.NewRegistry()
	// Not keylane_nats_connected: KeylaneNoWorker's absent() must still
	// see that no worker is scraped.
	reg.MustRegister(metrics.NewNamespaces(js, c.namespace), metrics.BuildInfo())
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.Handle("/", page)
	srv := &http.Server{Handler: sameHost(ln.Addr().String(), host, mux), ReadHeaderTimeout: 10 * time.Second}
	mode := "with actions (redrive, delete, purge) as the NATS user allows"
	if *readOnly {
		mode = "read-only"
	}
	fmt.Fprintf(errOut, "keylane ui: serving namespace %s on http://%s/ %s; Ctrl-C stops\n", c.namespace, ln.Addr(), mode)
	if !loopback {
		fmt.Fprintf(errOut, "keylane ui: %s is not a loopback address: whoever reaches it acts with this console's NATS credentials\n", host)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err := <-done:
		return fmt.Errorf("ui: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	return nil
}

// isLoopback reports whether host names this machine only.
func isLoopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// sameHost refuses a request whose Host is a name other than the one
// served on, localhost or an IP address: a page of another site whose
// name was pointed at this address (DNS rebinding) could otherwise read
// the console and take its actions' tokens.
func sameHost(addr, listenHost string, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host, _, err := net.SplitHostPort(r.Host)
		if err != nil {
			host = r.Host
		}
		if net.ParseIP(strings.Trim(host, "[]")) == nil && !strings.EqualFold(host, "localhost") && !strings.EqualFold(host, listenHost) {
			http.Error(w, fmt.Sprintf("keylane ui: refused a request for host %q: open the console at http://%s/", r.Host, addr), http.StatusMisdirectedRequest)
			return
		}
		h.ServeHTTP(w, r)
	})
}
