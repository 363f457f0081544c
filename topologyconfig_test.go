package keylane

import (
	"reflect"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/namespace"
)

// TestTopologyConfigCarriesEveryField: TopologyConfig and package
// namespace's Config have the same fields, and a round trip through
// namespace.Config keeps every one (maxDeliver too), so a field added to
// one and not the other fails here instead of being dropped silently on
// its way to Setup.
func TestTopologyConfigCarriesEveryField(t *testing.T) {
	root, ns := reflect.TypeFor[TopologyConfig](), reflect.TypeFor[namespace.Config]()
	if root.NumField() != ns.NumField() {
		t.Fatalf("TopologyConfig has %d fields, namespace.Config %d", root.NumField(), ns.NumField())
	}
	for i := range root.NumField() {
		rf, nf := root.Field(i), ns.Field(i)
		if !(rf.Name == nf.Name || rf.Name == "maxDeliver" && nf.Name == "MaxDeliver") || rf.Type != nf.Type {
			t.Errorf("field %d: TopologyConfig.%s %s, namespace.Config.%s %s", i, rf.Name, rf.Type, nf.Name, nf.Type)
		}
	}
	c := TopologyConfig{
		Namespace: "ns", Partitions: 8, StreamShards: 2, Replicas: 3, DuplicateWindow: 3 * time.Minute,
		LeaseTTL: 2 * time.Second, ResultsTTL: time.Minute, MaxBytes: 1 << 20, ReplyPrefix: "r.",
		MaxKeyBacklog: 5, Delays: true, maxDeliver: 7,
	}
	v := reflect.ValueOf(c)
	for i := range v.NumField() {
		if v.Field(i).IsZero() {
			t.Fatalf("the test leaves TopologyConfig.%s zero: set it", root.Field(i).Name)
		}
	}
	if got := topologyConfig(c.config()); got != c {
		t.Fatalf("round trip through namespace.Config: %+v, want %+v", got, c)
	}
}
