package kube

import (
	"context"
	"errors"
	"io"
	"net"
	"syscall"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/wait"
)

// DefaultRetryBound is how long Retry keeps trying a temporary failure: long
// enough to ride out an apiserver restart behind a single-node endpoint.
const DefaultRetryBound = 2 * time.Minute

// IsTransient reports whether err is worth retrying: the apiserver was
// unreachable, restarting, overloaded or timed out. Anything else (not
// found, forbidden, invalid, a conflict) is not.
func IsTransient(err error) bool {
	if err == nil {
		return false
	}

	if apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err) || apierrors.IsTooManyRequests(err) ||
		apierrors.IsServiceUnavailable(err) || apierrors.IsInternalError(err) || apierrors.IsUnexpectedServerError(err) {
		return true
	}

	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) {
		return true
	}

	var netErr net.Error

	return errors.As(err, &netErr)
}

// Retry calls fn until it succeeds, fails with an error that is not
// temporary, ctx ends, or bound passes (0 means DefaultRetryBound); it
// returns the last error. Attempts back off from 200ms to 5s.
func Retry(ctx context.Context, bound time.Duration, fn func(ctx context.Context) error) error {
	if bound <= 0 {
		bound = DefaultRetryBound
	}

	deadline := time.Now().Add(bound)
	backoff := wait.Backoff{Duration: 200 * time.Millisecond, Factor: 2, Jitter: 0.1, Steps: 1 << 30, Cap: 5 * time.Second}

	for {
		err := fn(ctx)
		if err == nil || !IsTransient(err) || ctx.Err() != nil {
			return err
		}

		d := backoff.Step()
		if time.Now().Add(d).After(deadline) {
			return err
		}

		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()

			return err
		case <-t.C:
		}
	}
}
