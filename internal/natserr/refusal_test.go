package natserr_test

import (
	"context"
	"testing"

	"github.com/keylane/keylane/internal/natserr"
)

// BenchmarkRefusalWatch is what watching for the server's refusal adds to
// a Submit whose ack comes in time: the watch's context and timer, set up
// and stopped. (The refusal itself is tested against a server with
// permissions: docs/security, TestRefusedPublishFailsFast.)
func BenchmarkRefusalWatch(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		_, stop := natserr.RefusalWatch(context.Background(), nil, nil, "a.jobs.1")
		stop()
	}
}
