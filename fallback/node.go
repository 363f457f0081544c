package fallback

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"

	"github.com/redis/go-redis/v9"
)

// Client is what the package needs from a Redis connection: scripts, and a
// pub/sub for release notifications. *redis.Client, *redis.ClusterClient,
// *redis.Ring and redis.UniversalClient all satisfy it.
type Client interface {
	redis.Scripter
	Subscribe(ctx context.Context, channels ...string) *redis.PubSub
}

// node is one Redis deployment: the caller's client for pub/sub, a client
// that never retries for the mutating scripts, and the shared subscription.
type node struct {
	client  Client
	scripts redis.Scripter
	owned   interface{ Close() error } // non-retrying clone we made, or nil
	notify  *notifier
}

// newNode makes sure mutating scripts are never retried blindly: go-redis
// resends a command after a connection error (MaxRetries defaults to 3), and
// a resent EVAL may apply twice (a reentrant count of 2, a second fence). For
// *redis.Client and *redis.ClusterClient with retries on, we open a clone
// with MaxRetries -1 for scripts. Other implementations must be configured
// with retries off by the caller; see doc.go.
func newNode(c Client, log *slog.Logger) (*node, error) {
	if c == nil {
		return nil, fmt.Errorf("fallback: nil Client")
	}
	n := &node{client: c, scripts: c, notify: newNotifier(c, log)}
	switch rc := c.(type) {
	case *redis.Client:
		if rc.Options().MaxRetries > 0 {
			opt := *rc.Options()
			opt.MaxRetries = -1
			// The original client installed its own push processor in its
			// options; the clone needs its own.
			opt.PushNotificationProcessor = nil
			if opt.MaintNotificationsConfig != nil {
				mc := *opt.MaintNotificationsConfig
				opt.MaintNotificationsConfig = &mc
			}
			clone := redis.NewClient(&opt)
			n.scripts, n.owned = clone, clone
		}
	case *redis.ClusterClient:
		if rc.Options().MaxRetries > 0 {
			opt := *rc.Options()
			opt.MaxRetries = -1
			opt.PushNotificationProcessor = nil
			if opt.MaintNotificationsConfig != nil {
				mc := *opt.MaintNotificationsConfig
				opt.MaintNotificationsConfig = &mc
			}
			clone := redis.NewClusterClient(&opt)
			n.scripts, n.owned = clone, clone
		}
	}
	return n, nil
}

func (n *node) close() error {
	n.notify.close()
	if n.owned != nil {
		return n.owned.Close()
	}
	return nil
}

// newToken returns 16 bytes from crypto/rand, hex encoded.
func newToken() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b) // never fails since Go 1.24; it crashes instead
	return hex.EncodeToString(b)
}

func errUnexpected(v any) error {
	return fmt.Errorf("fallback: unexpected script reply %v (%T)", v, v)
}

// keys of one lock name; all share the hash tag {name}.
type keys struct {
	lock, fence, queue, timeouts, readers, channel string
}

func (c *Config) keys(name string) keys {
	base := c.KeyPrefix + "{" + name + "}"
	return keys{
		lock:     base,
		fence:    base + ":fence",
		queue:    base + ":queue",
		timeouts: base + ":timeouts",
		readers:  base + ":readers",
		channel:  base + ":released",
	}
}
