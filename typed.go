package keylane

import (
	"context"
	"encoding/json"
	"fmt"
)

// Typed jobs: requests, responses and reducer state as Go values, carried
// as JSON. They are thin layers over Call, Submit, Reducer and Handler:
// the wire format stays bytes, so typed and untyped clients and workers
// mix freely.

// CallJSON submits req, JSON-encoded, as a job of key, waits for its
// result like Call, and decodes the result into a Resp. A result that does
// not decode is an error naming the job's key; the job itself ran.
func CallJSON[Resp any](ctx context.Context, c *Client, key string, req any, opts ...SubmitOpt) (Resp, error) {
	var resp Resp
	payload, err := json.Marshal(req)
	if err != nil {
		return resp, fmt.Errorf("keylane: encode request for %s: %w", key, err)
	}
	res, err := c.Call(ctx, key, payload, opts...)
	if err != nil {
		return resp, err
	}
	if err := json.Unmarshal(res, &resp); err != nil {
		return resp, fmt.Errorf("keylane: decode result of %s: %w", key, err)
	}
	return resp, nil
}

// SubmitJSON stores req, JSON-encoded, as a job of key, like Submit.
func SubmitJSON(ctx context.Context, c *Client, key string, req any, opts ...SubmitOpt) (string, error) {
	payload, err := json.Marshal(req)
	if err != nil {
		return "", fmt.Errorf("keylane: encode request for %s: %w", key, err)
	}
	return c.Submit(ctx, key, payload, opts...)
}

// ReduceFunc is a typed reducer: from a key's state and a job's request to
// the key's next state and the job's response. A key never written starts
// from S's zero value. The rules of Reducer hold: no side effect, and the
// state passed in must not be modified in place.
type ReduceFunc[S, Req, Resp any] func(ctx context.Context, job Job, state S, req Req) (next S, resp Resp, err error)

// JSONReducer makes a Reducer of f, with state, request and response in
// JSON. A payload or a stored state that does not decode is a permanent
// error: the job is dead-lettered at once, and nothing is written.
func JSONReducer[S, Req, Resp any](f ReduceFunc[S, Req, Resp]) Reducer {
	return ReducerFunc(func(ctx context.Context, job Job, state []byte) ([]byte, []byte, error) {
		var cur S
		if state != nil {
			if err := json.Unmarshal(state, &cur); err != nil {
				return nil, nil, Permanent(fmt.Errorf("keylane: state of %s is not a %T: %w", job.Key, cur, err))
			}
		}
		var req Req
		if err := json.Unmarshal(job.Payload, &req); err != nil {
			return nil, nil, Permanent(fmt.Errorf("keylane: payload of job %s is not a %T: %w", job.ID, req, err))
		}
		next, resp, err := f(ctx, job, cur, req)
		if err != nil {
			return nil, nil, err
		}
		nb, err := json.Marshal(next)
		if err != nil {
			return nil, nil, Permanent(fmt.Errorf("keylane: encode state of %s: %w", job.Key, err))
		}
		rb, err := json.Marshal(resp)
		if err != nil {
			return nil, nil, Permanent(fmt.Errorf("keylane: encode response of job %s: %w", job.ID, err))
		}
		return nb, rb, nil
	})
}

// JSONHandler makes a Handler of f, with request and response in JSON. A
// payload that does not decode is a permanent error.
func JSONHandler[Req, Resp any](f func(ctx context.Context, job Job, req Req) (Resp, error)) Handler {
	return HandlerFunc(func(ctx context.Context, job Job) ([]byte, error) {
		var req Req
		if err := json.Unmarshal(job.Payload, &req); err != nil {
			return nil, Permanent(fmt.Errorf("keylane: payload of job %s is not a %T: %w", job.ID, req, err))
		}
		resp, err := f(ctx, job, req)
		if err != nil {
			return nil, err
		}
		rb, err := json.Marshal(resp)
		if err != nil {
			return nil, Permanent(fmt.Errorf("keylane: encode response of job %s: %w", job.ID, err))
		}
		return rb, nil
	})
}

// ReducerMux routes jobs to reducers by Job.Type, as Mux does for
// handlers: one key's state, several kinds of job (hold, release, buy).
// An unknown type is a permanent error. Register reducers before the
// worker starts; ReducerMux is not safe for concurrent registration.
type ReducerMux struct {
	reducers map[string]Reducer
}

// NewReducerMux returns an empty ReducerMux.
func NewReducerMux() *ReducerMux { return &ReducerMux{reducers: map[string]Reducer{}} }

// HandleType registers r for jobs of type typ.
func (m *ReducerMux) HandleType(typ string, r Reducer) { m.reducers[typ] = r }

// Reduce runs the reducer registered for job.Type.
func (m *ReducerMux) Reduce(ctx context.Context, job Job, state []byte) ([]byte, []byte, error) {
	r, ok := m.reducers[job.Type]
	if !ok {
		return nil, nil, Permanent(fmt.Errorf("%w %q", ErrUnknownType, job.Type))
	}
	return r.Reduce(ctx, job, state)
}

// Committed passes the outcome on to the reducer of job.Type if it
// observes commits (CommitObserver).
func (m *ReducerMux) Committed(job Job, applied bool) {
	if o, ok := m.reducers[job.Type].(CommitObserver); ok {
		o.Committed(job, applied)
	}
}
