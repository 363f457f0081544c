package namespace

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/keylane/keylane/internal/core"
	"github.com/nats-io/nats.go/jetstream"
)

// ShardLeader says which server leads one jobs stream shard: the server
// that stores and acks every job of the shard's partitions first.
type ShardLeader struct {
	Shard  int
	Stream string
	// Leader is the leading server's name; empty while the shard has no
	// leader, and on a server that is not clustered.
	Leader string
	// Followers are the other servers that hold a replica and are current.
	Followers []string
}

// ShardLeaders returns the leader of every jobs stream shard of the
// namespace, by shard.
func ShardLeaders(ctx context.Context, js jetstream.JetStream, namespace string) ([]ShardLeader, error) {
	streams, _, err := OpenShards(ctx, js, namespace)
	if err != nil {
		return nil, err
	}
	out := make([]ShardLeader, len(streams))
	for i, s := range streams {
		info, err := s.Info(ctx)
		if err != nil {
			return nil, err
		}
		out[i] = ShardLeader{Shard: i, Stream: info.Config.Name}
		if c := info.Cluster; c != nil {
			out[i].Leader = c.Leader
			for _, p := range c.Replicas {
				if p != nil && p.Current && !p.Offline {
					out[i].Followers = append(out[i].Followers, p.Name)
				}
			}
		}
	}
	return out, nil
}

// SpreadLeaders moves shard leaders so that no server leads more than
// ⌈S/servers⌉ shards where the replicas allow it: the stream leader does
// a shard's storage work, and shards whose leaders share a server share
// its cores. It asks an overloaded leader to step down in favour of the
// least loaded current follower (the stepdown's preferred placement,
// nats-server 2.11 and later) and waits for the new leader. The cluster
// elects leaders on its own again after a failure or restart, so run it
// after those too. It returns the leaders after the moves; it changes
// nothing on a single server.
func SpreadLeaders(ctx context.Context, js jetstream.JetStream, namespace string) ([]ShardLeader, error) {
	leaders, err := ShardLeaders(ctx, js, namespace)
	if err != nil {
		return nil, err
	}
	load := map[string]int{}
	for _, l := range leaders {
		for _, f := range l.Followers {
			load[f] += 0
		}
		if l.Leader != "" {
			load[l.Leader]++
		}
	}
	if len(load) < 2 {
		return leaders, nil
	}
	limit := (len(leaders) + len(load) - 1) / len(load)
	for i, l := range leaders {
		if l.Leader == "" || load[l.Leader] <= limit {
			continue
		}
		to := ""
		for _, f := range l.Followers {
			if load[f] < limit && (to == "" || load[f] < load[to]) {
				to = f
			}
		}
		if to == "" {
			continue
		}
		if err := stepDownStream(ctx, js, l.Stream, l.Leader, to); err != nil {
			return leaders, err
		}
		load[l.Leader]--
		load[to]++
		leaders[i].Leader = to
	}
	return ShardLeaders(ctx, js, namespace)
}

// stepDownStream asks stream's leader (old) to hand over to server and
// waits until another server leads: usually server, though an election
// may pick another.
func stepDownStream(ctx context.Context, js jetstream.JetStream, stream, old, server string) error {
	body, err := json.Marshal(map[string]any{"placement": map[string]string{"preferred": server}})
	if err != nil {
		return err
	}
	rctx, cancel := context.WithTimeout(ctx, core.RequestTimeout)
	msg, err := js.Conn().RequestWithContext(rctx, APIPrefix(js)+"STREAM.LEADER.STEPDOWN."+stream, body)
	cancel()
	if err != nil {
		return fmt.Errorf("keylane: step down %s for %s: %w", stream, server, err)
	}
	var resp struct {
		Error   *jetstream.APIError `json:"error"`
		Success bool                `json:"success"`
	}
	if err := json.Unmarshal(msg.Data, &resp); err != nil {
		return fmt.Errorf("keylane: step down %s: bad response %q: %w", stream, msg.Data, err)
	}
	if resp.Error != nil {
		return fmt.Errorf("keylane: step down %s for %s: %w", stream, server, resp.Error)
	}
	pause := 20 * time.Millisecond
	for {
		ictx, cancel := context.WithTimeout(ctx, core.RequestTimeout)
		s, err := js.Stream(ictx, stream)
		cancel()
		if err == nil {
			if c := s.CachedInfo().Cluster; c != nil && c.Leader != "" && c.Leader != old {
				return nil
			}
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("keylane: %s still led by %s after stepping down: %w", stream, old, errors.Join(ctx.Err(), err))
		case <-t.C:
		}
		pause = min(2*pause, 500*time.Millisecond)
	}
}

// APIPrefix is the JetStream API prefix js sends requests under, as
// nats.go computes it (New, NewWithAPIPrefix, NewWithDomain).
func APIPrefix(js jetstream.JetStream) string {
	o := js.Options()
	switch {
	case o.APIPrefix != "":
		return strings.TrimSuffix(o.APIPrefix, ".") + "."
	case o.Domain != "":
		return "$JS." + o.Domain + ".API."
	}
	return jetstream.DefaultAPIPrefix
}
