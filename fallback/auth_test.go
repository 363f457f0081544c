package fallback_test

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/testcerts"

	"github.com/redis/go-redis/v9"

	"github.com/keylane/keylane/fallback"
	"github.com/keylane/keylane/internal/redistest"
	"github.com/keylane/keylane/internal/testwait"
)

// aclRules is the least-privilege ACL of a fallback user under the default
// KeyPrefix: its keys and release channels, and only the commands the
// package and its scripts send. fallback/README.md and docs/fallback.md
// show the same line; the test checks they do.
const aclRules = "~keylane:lock:* &keylane:lock:* -@all +evalsha +eval +subscribe +unsubscribe +ping " +
	"+get +set +del +exists +incr +pexpire +pexpireat +pttl +publish +time " +
	"+hget +hset +hexists +hincrby +rpush +lpop +lindex +lrem " +
	"+zadd +zcard +zrange +zrangebyscore +zrem +zremrangebyscore +zscore"

// narrowRules lets a user run the plain mutex's scripts and nothing else.
const narrowRules = "~keylane:lock:* &keylane:lock:* -@all +evalsha +eval +subscribe +unsubscribe +ping " +
	"+get +set +del +incr +pexpire +pttl +publish"

// userArgs are redis-server arguments that define an ACL user.
func userArgs(name, password, rules string) []string {
	return append([]string{"--user", name, "on", ">" + password}, strings.Fields(rules)...)
}

func startRedis(t *testing.T, args ...string) *redistest.Server {
	t.Helper()
	srv, err := redistest.Start(args...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	return srv
}

func lockerFor(t *testing.T, opt *redis.Options, cfg *fallback.Config) *fallback.Locker {
	t.Helper()
	c := redis.NewClient(opt)
	t.Cleanup(func() { _ = c.Close() })
	l, err := fallback.New(c, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// connections returns how many connections srv has accepted so far.
func connections(t *testing.T, admin *redis.Client) int {
	t.Helper()
	info, err := admin.Info(t.Context(), "stats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "total_connections_received:"); ok {
			n, err := strconv.Atoi(v)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("no total_connections_received in INFO stats:\n%s", info)
	return 0
}

// refusedAtOnce checks that a blocking Lock refused by Redis returns a
// *RefusedError naming the server and the lock, at once, after one
// connection: no retry loop, no wait for ctx.
func refusedAtOnce(t *testing.T, admin *redis.Client, m *fallback.Mutex, addr, key string, want ...string) {
	t.Helper()
	before := connections(t, admin)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	start := time.Now()
	l, err := m.Lock(ctx)
	took := time.Since(start)
	if err == nil {
		_ = l.Unlock(ctx)
		t.Fatal("Lock succeeded")
	}
	t.Logf("refused: %v", err)
	var re *fallback.RefusedError
	if !errors.Is(err, fallback.ErrRefused) || !errors.Is(err, fallback.ErrNotAcquired) || !errors.As(err, &re) || re.Addr != addr {
		t.Fatalf("Lock: %v; want a *RefusedError for %s, wrapping ErrNotAcquired", err, addr)
	}
	for _, w := range append(want, addr, strconv.Quote(key)) {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("Lock's error %q does not say %q", err, w)
		}
	}
	// Half the 20 s context: this tells "returned on the refusal" from
	// "waited for the context" (the connection count above shows no
	// retry loop), and a loaded machine does not blur the two.
	if took > 10*time.Second {
		t.Errorf("a refused Lock took %s; it must not wait for its context", took)
	}
	if n := connections(t, admin) - before; n != 1 {
		t.Errorf("a refused Lock opened %d connections; want 1 (no retry, no undo)", n)
	}
}

// A wrong, missing or unknown credential is a clear error at once.
func TestRefusedCredentials(t *testing.T) {
	srv := startRedis(t, "--requirepass", "right")
	admin := redis.NewClient(&redis.Options{Addr: srv.Addr, Password: "right"})
	t.Cleanup(func() { _ = admin.Close() })
	for _, c := range []struct {
		name string
		opt  redis.Options
		want []string
	}{
		{"wrong password", redis.Options{Password: "wrong"}, []string{"WRONGPASS", "the default user"}},
		{"no password", redis.Options{}, []string{"NOAUTH"}},
		{"unknown user", redis.Options{Username: "mallory", Password: "right"}, []string{"WRONGPASS", `user "mallory"`}},
	} {
		t.Run(c.name, func(t *testing.T) {
			opt := c.opt
			opt.Addr = srv.Addr
			key := uniqueKey(t)
			refusedAtOnce(t, admin, lockerFor(t, &opt, nil).Mutex(key), srv.Addr, key, c.want...)
		})
	}
	t.Run("right password", func(t *testing.T) {
		l := lockerFor(t, &redis.Options{Addr: srv.Addr, Password: "right"}, nil)
		if err := l.Do(ctxT(t, 10*time.Second), uniqueKey(t), func(context.Context, uint64) error { return nil }); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("RedLock, every node refuses", func(t *testing.T) {
		var clients []fallback.Client
		for range 3 {
			c := redis.NewClient(&redis.Options{Addr: srv.Addr, Password: "wrong"})
			t.Cleanup(func() { _ = c.Close() })
			clients = append(clients, c)
		}
		rl, err := fallback.NewRedLock(clients, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer rl.Close()
		start := time.Now()
		_, err = rl.Mutex(uniqueKey(t)).Lock(ctxT(t, 20*time.Second))
		var qe *fallback.QuorumError
		if !errors.Is(err, fallback.ErrRefused) || !errors.As(err, &qe) || !strings.Contains(err.Error(), "WRONGPASS") {
			t.Fatalf("RedLock.Lock: %v; want a QuorumError wrapping ErrRefused", err)
		}
		// Half the context's 20 s: what is judged is whether it waited for
		// its context (the bug) or returned on the refusals, not speed.
		if took := time.Since(start); took > 10*time.Second {
			t.Fatalf("RedLock.Lock refused by every node took %s; it must not wait for its context", took)
		}
	})
}

// The ACL user of the README, and only its keys and channels: every kind
// of lock works under it, waiters are woken through its channels, and a
// prefix outside its keys, or a user without a script's commands, is a
// clear error.
func TestACLUser(t *testing.T) {
	args := []string{"--user", "default", "off"}
	args = append(args, userArgs("keylane", "s3cret", aclRules)...)
	args = append(args, userArgs("narrow", "n4rrow", narrowRules)...)
	args = append(args, userArgs("admin", "adm1n", "~* &* +@all")...)
	srv := startRedis(t, args...)
	admin := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "admin", Password: "adm1n"})
	t.Cleanup(func() { _ = admin.Close() })
	user := &redis.Options{Addr: srv.Addr, Username: "keylane", Password: "s3cret"}

	t.Run("README shows the rules", func(t *testing.T) {
		for _, path := range []string{"README.md", "../docs/fallback.md"} {
			readme, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(strings.Join(strings.Fields(string(readme)), " "), "user keylane on >CHANGE-ME "+aclRules) {
				t.Errorf("%s does not show the tested ACL rules:\n%s", path, aclRules)
			}
		}
	})
	t.Run("every kind of lock", func(t *testing.T) {
		l := lockerFor(t, user, nil)
		ctx := ctxT(t, 20*time.Second)
		key := uniqueKey(t)
		noop := func(context.Context, uint64) error { return nil }
		if err := l.Do(ctx, key, noop); err != nil {
			t.Fatalf("Mutex: %v", err)
		}
		a, err := l.Mutex(key).Lock(ctx, fallback.WithOwner("order-1"))
		if err != nil {
			t.Fatalf("reentrant: %v", err)
		}
		b, err := l.Mutex(key).Lock(ctx, fallback.WithOwner("order-1"))
		if err != nil {
			t.Fatalf("reentrant again: %v", err)
		}
		if err := errors.Join(b.Unlock(ctx), a.Unlock(ctx)); err != nil {
			t.Fatalf("reentrant unlock: %v", err)
		}
		if err := l.FairMutex(uniqueKey(t)).Do(ctx, noop); err != nil {
			t.Fatalf("FairMutex: %v", err)
		}
		rw := l.RWMutex(uniqueKey(t))
		if err := errors.Join(rw.RDo(ctx, noop), rw.Do(ctx, noop)); err != nil {
			t.Fatalf("RWMutex: %v", err)
		}
	})
	t.Run("a waiter is woken", func(t *testing.T) {
		l := lockerFor(t, user, &fallback.Config{MinBackoff: time.Minute, MaxBackoff: time.Minute})
		ctx := ctxT(t, 20*time.Second)
		m := l.Mutex(uniqueKey(t))
		held, err := m.Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan error, 1)
		go func() {
			l2, err := m.Lock(ctx)
			if err == nil {
				err = l2.Unlock(ctx)
			}
			got <- err
		}()
		channel := "keylane:lock:{" + held.Key() + "}:released"
		testwait.Eventually(t, 10*time.Second, "the waiter subscribes to its release channel", func() bool {
			select {
			case err := <-got:
				t.Fatalf("the waiter returned %v while the lock was held", err)
			default:
			}
			n, err := admin.PubSubNumSub(ctx, channel).Result()
			return err == nil && n[channel] == 1
		})
		start := time.Now()
		if err := held.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-got; err != nil {
			t.Fatal(err)
		}
		// Backoff is a minute: only the notification, through the
		// user's channel permission, wakes it this soon.
		if took := time.Since(start); took > 5*time.Second {
			t.Fatalf("the waiter took %s after the release", took)
		}
	})
	t.Run("a key outside the user's pattern", func(t *testing.T) {
		key := uniqueKey(t)
		m := lockerFor(t, user, &fallback.Config{KeyPrefix: "other:"}).Mutex(key)
		refusedAtOnce(t, admin, m, srv.Addr, key, "NOPERM", `user "keylane"`)
	})
	t.Run("a user without a script's commands", func(t *testing.T) {
		key := uniqueKey(t)
		narrow := &redis.Options{Addr: srv.Addr, Username: "narrow", Password: "n4rrow"}
		m := lockerFor(t, narrow, nil).FairMutex(key)
		refusedAtOnce(t, admin, m, srv.Addr, key, "can't run this command", `user "narrow"`)
	})
}

// A guessed or forged token neither releases nor extends another
// holder's lock: the scripts refuse it, a Lock carrying it reports the
// lock lost and its Unlock says the lock is not held, and the holder keeps
// the lock with its own expiry.
func TestForgedTokenCannotReleaseOrExtend(t *testing.T) {
	l, rdb := newLocker(t, nil)
	ctx := ctxT(t, 30*time.Second)
	key := uniqueKey(t)
	lockKey, _, _, _, _ := fallback.KeysOf(nil, key)
	holder, err := l.Mutex(key).Lock(ctx, fallback.WithLeaseTime(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	token, err := rdb.Get(ctx, lockKey).Result()
	if err != nil {
		t.Fatal(err)
	}
	src := map[string]string{}
	for _, s := range fallback.Scripts() {
		src[s.Name] = s.Src
	}
	guess := make([]byte, 16)
	_, _ = rand.Read(guess)
	stillHeld := func(after string) {
		t.Helper()
		got, err := rdb.Get(ctx, lockKey).Result()
		if err != nil || got != token {
			t.Fatalf("after %s: the lock holds %q (%v), want the holder's token", after, got, err)
		}
		if pttl := rdb.PTTL(ctx, lockKey).Val(); pttl > 5*time.Second || pttl < time.Second {
			t.Fatalf("after %s: PTTL %s; the holder's 5s lease was changed", after, pttl)
		}
	}
	for _, forged := range []string{
		string(guess), "", "0", "1", strconv.FormatUint(holder.Fence(), 10),
		strings.ToUpper(token), token + " ", token[:len(token)-1], "*", token + "\x00",
	} {
		released, err := rdb.Eval(ctx, src["release.lua"], []string{lockKey}, forged, "ch").Int()
		if err != nil || released != 0 {
			t.Fatalf("release.lua with forged token %q: %d, %v; want 0", forged, released, err)
		}
		stillHeld("release with token " + strconv.Quote(forged))
		renewed, err := rdb.Eval(ctx, src["renew.lua"], []string{lockKey}, forged, "60000").Int()
		if err != nil || renewed != 0 {
			t.Fatalf("renew.lua with forged token %q: %d, %v; want 0", forged, renewed, err)
		}
		stillHeld("renew with token " + strconv.Quote(forged))
	}

	// Through the package: a Lock carrying a forged token. Its watchdog's
	// renewal is refused (it would have set the expiry to 1s), so it ends
	// with ErrLost; its Unlock says the lock is not held, and deletes
	// nothing.
	forged := fallback.ForgedLock(l, key, hex.EncodeToString(guess), time.Second)
	select {
	case <-forged.Done():
	case <-ctx.Done():
		t.Fatal("the forged lock's renewal was not refused")
	}
	if !errors.Is(forged.Err(), fallback.ErrLost) {
		t.Fatalf("the forged lock ended with %v, want ErrLost (its renewal refused)", forged.Err())
	}
	stillHeld("a forged lock's renewal")
	err = forged.Unlock(ctx)
	t.Logf("Unlock with a forged token: %v", err)
	if !errors.Is(err, fallback.ErrNotHeld) || !errors.Is(err, fallback.ErrLost) || !strings.Contains(err.Error(), strconv.Quote(key)) || !strings.Contains(err.Error(), "nothing deleted") {
		t.Fatalf("Unlock with a forged token: %v; want ErrNotHeld naming %q, saying nothing was deleted, and why (ErrLost)", err, key)
	}
	stillHeld("Unlock with a forged token")

	// The reentrant lock's owner is its token: another owner can neither
	// release nor renew it.
	rkey := uniqueKey(t)
	rLockKey, _, _, _, _ := fallback.KeysOf(nil, rkey)
	owned, err := l.Mutex(rkey).Lock(ctx, fallback.WithOwner("order-1"), fallback.WithLeaseTime(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for _, other := range []string{"order-2", "", "order-1 ", "ORDER-1"} {
		left, err := rdb.Eval(ctx, src["reentrant_release.lua"], []string{rLockKey}, other, "ch").Int()
		if err != nil || left != -1 {
			t.Fatalf("reentrant_release.lua as owner %q: %d, %v; want -1", other, left, err)
		}
		renewed, err := rdb.Eval(ctx, src["reentrant_renew.lua"], []string{rLockKey}, other, "60000").Int()
		if err != nil || renewed != 0 {
			t.Fatalf("reentrant_renew.lua as owner %q: %d, %v; want 0", other, renewed, err)
		}
	}
	if pttl := rdb.PTTL(ctx, rLockKey).Val(); pttl > 5*time.Second || pttl < time.Second {
		t.Fatalf("the reentrant lock's PTTL is %s after forged owners", pttl)
	}
	if err := errors.Join(owned.Unlock(ctx), holder.Unlock(ctx)); err != nil {
		t.Fatalf("the real holders could not unlock: %v", err)
	}
}

// The TLS configuration of docs/fallback.md against a redis-server that speaks TLS
// only, with the ACL user: locks work; a client that does not trust the
// server's CA, or does not speak TLS, gets an error at once.
func TestTLS(t *testing.T) {
	pki := testcerts.New(t, t.TempDir(), "redis")
	caFile, certFile, keyFile, pool := pki.CA, pki.ServerCert, pki.ServerKey, pki.Pool
	tlsCfg := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	args := append([]string{"--user", "default", "off"}, userArgs("keylane", "s3cret", aclRules)...)
	srv, err := redistest.StartTLS(redistest.TLS{CertFile: certFile, KeyFile: keyFile, CAFile: caFile, Client: tlsCfg}, args...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)

	l := lockerFor(t, &redis.Options{Addr: srv.Addr, Username: "keylane", Password: "s3cret", TLSConfig: tlsCfg}, nil)
	ctx := ctxT(t, 20*time.Second)
	if err := l.Do(ctx, uniqueKey(t), func(context.Context, uint64) error { return nil }); err != nil {
		t.Fatalf("a lock over TLS: %v", err)
	}
	for name, c := range map[string]struct {
		tls  *tls.Config
		want string
	}{
		"untrusted CA": {&tls.Config{RootCAs: x509.NewCertPool(), MinVersion: tls.VersionTLS12}, "x509"},
		"no TLS":       {nil, ""},
	} {
		t.Run(name, func(t *testing.T) {
			m := lockerFor(t, &redis.Options{Addr: srv.Addr, Username: "keylane", Password: "s3cret", TLSConfig: c.tls, DialTimeout: time.Second, ReadTimeout: time.Second}, nil).Mutex(uniqueKey(t))
			start := time.Now()
			_, err := m.Lock(ctxT(t, 20*time.Second))
			if !errors.Is(err, fallback.ErrNotAcquired) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Lock: %v; want ErrNotAcquired saying %q", err, c.want)
			}
			if took := time.Since(start); took > 5*time.Second {
				t.Fatalf("Lock took %s", took)
			}
		})
	}
}

// TestPartialPermissions: a user whose ACL misses a command a script runs
// after it wrote, or the release channel, must never be left with a lock
// that nobody holds, nor told "failed" for an unlock that released.
func TestPartialPermissions(t *testing.T) {
	args := []string{"--user", "default", "off"}
	// No channel: the release's PUBLISH comes after its DEL.
	args = append(args, userArgs("nochan", "p", "~keylane:lock:* resetchannels -@all +evalsha +eval +ping +get +set +del +incr +pexpire +pttl")...)
	// No INCR: acquire.lua refuses it after its SET.
	args = append(args, userArgs("noincr", "p", "~keylane:lock:* &keylane:lock:* -@all +evalsha +eval +ping +get +set +del +pexpire +pttl +publish")...)
	args = append(args, userArgs("admin", "adm1n", "~* &* +@all")...)
	srv := startRedis(t, args...)
	admin := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "admin", Password: "adm1n"})
	t.Cleanup(func() { _ = admin.Close() })
	ctx := t.Context()

	t.Run("unlock without the channel", func(t *testing.T) {
		l := lockerFor(t, &redis.Options{Addr: srv.Addr, Username: "nochan", Password: "p"}, nil)
		lk, err := l.Mutex("nochan").Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := lk.Unlock(ctx); err != nil {
			t.Fatalf("Unlock: %v; the lock was released, the wake-up is best effort", err)
		}
		if keys, _ := admin.Keys(ctx, "keylane:lock:*nochan*").Result(); len(keys) > 1 {
			t.Fatalf("still there after Unlock: %v", keys) // the fence counter stays
		}
	})
	t.Run("refused inside the acquire script", func(t *testing.T) {
		l := lockerFor(t, &redis.Options{Addr: srv.Addr, Username: "noincr", Password: "p"}, nil)
		_, err := l.Mutex("noincr").Lock(ctx)
		if !errors.Is(err, fallback.ErrRefused) {
			t.Fatalf("Lock: %v; want ErrRefused", err)
		}
		keys, _ := admin.Keys(ctx, "keylane:lock:*noincr*").Result()
		if len(keys) != 0 {
			t.Errorf("left behind: %v (a lock nobody holds until its TTL)", keys)
		}
	})
}
