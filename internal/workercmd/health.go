package workercmd

import (
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"

	"github.com/keylane/keylane"
	"github.com/nats-io/nats.go"
)

// health answers /healthz and /readyz on the metrics port. The process
// is healthy while it answers at all. It is ready when its worker has
// started (the namespace checked: Setup or Open done, the member
// registered), its NATS connection is connected, and it is not stopping:
// then it owns partitions or may take them. A load balancer or an
// orchestrator sends it no traffic and counts it out otherwise.
type health struct {
	nc                *nats.Conn
	w                 *keylane.Worker
	started, draining atomic.Bool
}

// notReady says why the worker is not ready; nil when it is.
func (h *health) notReady() error {
	switch {
	case h.draining.Load():
		return errors.New("draining: stopping on a signal")
	case !h.started.Load():
		return errors.New("starting: the namespace is not checked yet")
	case h.nc.Status() != nats.CONNECTED:
		return fmt.Errorf("NATS %s", h.nc.Status())
	}
	select {
	case <-h.w.Done():
		return errors.New("stopped")
	default:
	}
	return nil
}

func (h *health) healthz(rw http.ResponseWriter, _ *http.Request) {
	rw.Header().Set("Content-Type", "text/plain; charset=utf-8")
	fmt.Fprintln(rw, "ok")
}

func (h *health) readyz(rw http.ResponseWriter, _ *http.Request) {
	rw.Header().Set("Content-Type", "text/plain; charset=utf-8")
	rw.Header().Set("Cache-Control", "no-store")
	if err := h.notReady(); err != nil {
		rw.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintln(rw, "not ready:", err)
		return
	}
	fmt.Fprintln(rw, "ready")
}
