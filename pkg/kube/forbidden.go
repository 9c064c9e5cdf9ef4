package kube

import (
	"io"
	"net/http"
	"time"

	utilnet "k8s.io/apimachinery/pkg/util/net"
)

// ForbiddenRetryBound is how long RetryForbidden tries a request again that
// was answered 403 Forbidden. A kube-apiserver that has just started denies
// every request until its authorization caches are synced (a second or
// two, more on a loaded machine), and a client behind the kubernetes
// Service or a load balancer meets such an apiserver whenever a control
// plane's apiserver restarts, as it does during an upgrade (seen on kind: a
// control plane's kubelet switched to the new version restarted its static
// pods, and the runner's drain of the next node was denied). A denial that
// lasts longer is a real one.
const ForbiddenRetryBound = 15 * time.Second

// RetryForbidden wraps a client's transport so that a request answered 403
// Forbidden is sent again, backing off from 250ms to 2s, until it is
// answered otherwise or ForbiddenRetryBound passes; the last answer is
// returned. A denied request was not carried out, so any request can be
// sent again; one whose body cannot be replayed is not.
func RetryForbidden(rt http.RoundTripper) http.RoundTripper {
	return forbiddenRetry{next: rt, bound: ForbiddenRetryBound}
}

type forbiddenRetry struct {
	next  http.RoundTripper
	bound time.Duration
}

// WrappedRoundTripper lets client-go reach the transport beneath, to cancel a
// request (a client's timeout) and to read its settings.
func (t forbiddenRetry) WrappedRoundTripper() http.RoundTripper { return t.next }

var _ utilnet.RoundTripperWrapper = forbiddenRetry{}

func (t forbiddenRetry) RoundTrip(req *http.Request) (*http.Response, error) {
	deadline := time.Now().Add(t.bound)
	delay := 250 * time.Millisecond
	for {
		resp, err := t.next.RoundTrip(req)
		if err != nil || resp.StatusCode != http.StatusForbidden ||
			time.Now().Add(delay).After(deadline) || (req.Body != nil && req.Body != http.NoBody && req.GetBody == nil) {
			return resp, err
		}
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		_ = resp.Body.Close()
		timer := time.NewTimer(delay)
		select {
		case <-req.Context().Done():
			timer.Stop()
			return nil, req.Context().Err()
		case <-timer.C:
		}
		delay = min(2*delay, 2*time.Second)
		if req.GetBody != nil {
			body, err := req.GetBody()
			if err != nil {
				return nil, err
			}
			req = req.Clone(req.Context())
			req.Body = body
		}
	}
}
