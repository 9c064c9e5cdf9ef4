package kube

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// apiserver answers 403 Forbidden to the first denied requests, as a
// kube-apiserver that has just started does until its authorization caches
// are synced, then serves a ConfigMap; it records the bodies it was sent.
func apiserver(t *testing.T, denied int32) (*httptest.Server, *atomic.Int32, *bodies) {
	t.Helper()
	var calls atomic.Int32
	sent := &bodies{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		sent.add(string(b))
		w.Header().Set("Content-Type", "application/json")
		if calls.Add(1) <= denied {
			w.WriteHeader(http.StatusForbidden)
			_, _ = io.WriteString(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"Forbidden","code":403,`+
				`"message":"configmaps \"x\" is forbidden: User \"system:serviceaccount:ichor-system:ichor-runner\" cannot get resource \"configmaps\""}`)
			return
		}
		_, _ = io.WriteString(w, `{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"x","namespace":"ns"}}`)
	}))
	t.Cleanup(srv.Close)
	return srv, &calls, sent
}

// bodies are the request bodies a server received, in order.
type bodies struct {
	mu  sync.Mutex
	all []string
}

func (b *bodies) add(s string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.all = append(b.all, s)
}

func (b *bodies) get() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.all)
}

func client(t *testing.T, host string, bound time.Duration) kubernetes.Interface {
	t.Helper()
	cfg := &rest.Config{Host: host}
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return forbiddenRetry{next: rt, bound: bound} })
	c, err := kubernetes.NewForConfig(cfg)
	require.NoError(t, err)
	return c
}

// An apiserver that denies a few requests while it starts: the request
// goes through once it no longer does, a write with its body intact.
func TestRetryForbiddenRidesOutAStartingAPIServer(t *testing.T) {
	srv, calls, _ := apiserver(t, 3)
	c := client(t, srv.URL, 10*time.Second)
	_, err := c.CoreV1().ConfigMaps("ns").Get(context.Background(), "x", metav1.GetOptions{})
	require.NoError(t, err)
	assert.EqualValues(t, 4, calls.Load())

	srv, calls, body := apiserver(t, 2)
	c = client(t, srv.URL, 10*time.Second)
	_, err = c.CoreV1().ConfigMaps("ns").Create(context.Background(),
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "x"}, Data: map[string]string{"k": "v"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	assert.EqualValues(t, 3, calls.Load())
	sent := body.get()
	require.Len(t, sent, 3)
	assert.NotEmpty(t, sent[0])
	assert.Equal(t, sent[0], sent[2], "the body sent again")
}

// A denial that lasts is a real one: it is returned once the bound passes.
func TestRetryForbiddenReturnsALastingDenial(t *testing.T) {
	srv, calls, _ := apiserver(t, 1<<30)
	c := client(t, srv.URL, time.Second)
	start := time.Now()
	_, err := c.CoreV1().ConfigMaps("ns").Get(context.Background(), "x", metav1.GetOptions{})
	require.True(t, apierrors.IsForbidden(err), "got %v", err)
	assert.Less(t, time.Since(start), 5*time.Second)
	assert.Greater(t, calls.Load(), int32(1))
}

// A cancelled request stops being tried.
func TestRetryForbiddenStopsWithTheRequest(t *testing.T) {
	srv, _, _ := apiserver(t, 1<<30)
	c := client(t, srv.URL, time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), 600*time.Millisecond)
	defer cancel()
	_, err := c.CoreV1().ConfigMaps("ns").Get(ctx, "x", metav1.GetOptions{})
	require.Error(t, err)
	require.ErrorIs(t, ctx.Err(), context.DeadlineExceeded)
}
