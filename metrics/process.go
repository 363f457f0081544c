package metrics

import (
	"github.com/keylane/keylane/internal/buildinfo"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
)

// Connected returns a gauge, keylane_nats_connected{worker}, that is 1
// while nc is connected to a server and 0 otherwise (reconnecting,
// closed, draining), read at scrape time.
func Connected(nc *nats.Conn, worker string) prometheus.Collector {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name:        "keylane_nats_connected",
		Help:        "1 while the worker's NATS connection is connected, 0 while it is reconnecting or closed.",
		ConstLabels: prometheus.Labels{"worker": worker},
	}, func() float64 {
		if nc.Status() == nats.CONNECTED {
			return 1
		}
		return 0
	})
}

// BuildInfo returns keylane_build_info{version,goversion,revision}, always
// 1: the keylane module's version in the running binary ("(devel)" when
// built from a checkout), the Go release that built it, and the VCS
// revision the binary was built from ("" when unknown; "-dirty" added for
// a modified tree).
func BuildInfo() prometheus.Collector {
	in := buildinfo.Read()
	version, goversion, revision := in.Version, in.Go, in.Revision
	if in.Modified && revision != "" {
		revision += "-dirty"
	}
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name:        "keylane_build_info",
		Help:        "Always 1; its labels say which keylane and Go built the binary.",
		ConstLabels: prometheus.Labels{"version": version, "goversion": goversion, "revision": revision},
	}, func() float64 { return 1 })
}
