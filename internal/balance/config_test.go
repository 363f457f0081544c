package balance

import (
	"context"
	"strings"
	"testing"
)

// TestStartRefusesAnIncompleteConfig: Start checks its Config before it
// touches a bucket.
func TestStartRefusesAnIncompleteConfig(t *testing.T) {
	for name, cfg := range map[string]Config[Owner]{
		"no ID":         {Partitions: 1},
		"no partitions": {ID: "wa"},
		"no buckets":    {ID: "wa", Partitions: 1},
	} {
		if _, err := Start(context.Background(), cfg); err == nil || !strings.HasPrefix(err.Error(), "balance: ") {
			t.Errorf("%s: Start = %v; want a balance: error", name, err)
		}
	}
}
