package kube

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
)

// listedNodes is a clientset whose k-th LIST of the Nodes (from 1) shows one Node whose
// kubelet runs v1.36.k, each LIST held until release gives way, and started told on
// started.
func listedNodes(release <-chan struct{}, started chan<- int) *fake.Clientset {
	cs := fake.NewClientset()

	var (
		mu    sync.Mutex
		lists int
	)

	cs.PrependReactor("list", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		lists++
		k := lists
		mu.Unlock()

		started <- k
		<-release

		return true, &corev1.NodeList{Items: []corev1.Node{*node("worker-1", fmt.Sprintf("v1.36.%d", k), true)}}, nil
	})

	return cs
}

// kubeletOf is the kubelet version a read saw.
func kubeletOf(t *testing.T, running []Running) string {
	t.Helper()

	for _, r := range running {
		if r.Component == discovery.Kubelet {
			return r.Version
		}
	}

	t.Fatal("no kubelet in the read")

	return ""
}

// TestObserverShares: a caller never gets a read that started before it called, and the
// callers that call while a read is under way share the next one.
func TestObserverShares(t *testing.T) {
	release, started := make(chan struct{}), make(chan int, 10)
	o := NewObserver(t.Context(), listedNodes(release, started))

	type result struct {
		version string
		err     error
	}

	call := func(out chan<- result) {
		running, err := o.Observe(t.Context())
		if err != nil {
			out <- result{err: err}

			return
		}

		out <- result{version: kubeletOf(t, running)}
	}

	first := make(chan result, 1)

	go call(first)
	require.Equal(t, 1, <-started, "the first caller starts a read")

	// Three callers while the first read is under way: it started before they called.
	later := make(chan result, 3)
	for range 3 {
		go call(later)
	}

	// They wait for the first read, then share one read of their own.
	require.Never(t, func() bool { return len(later) > 0 }, 100*time.Millisecond, 10*time.Millisecond)
	release <- struct{}{}

	got := <-first
	require.NoError(t, got.err)
	assert.Equal(t, "v1.36.1", got.version)

	require.Equal(t, 2, <-started, "one read for the three callers")
	release <- struct{}{}

	for range 3 {
		got := <-later
		require.NoError(t, got.err)
		assert.Equal(t, "v1.36.2", got.version, "a read that started after the call")
	}

	assert.Empty(t, started, "no third read")

	// A caller alone later gets a read of its own.
	alone := make(chan result, 1)

	go call(alone)
	require.Equal(t, 3, <-started)
	release <- struct{}{}

	got = <-alone
	require.NoError(t, got.err)
	assert.Equal(t, "v1.36.3", got.version)
}

// TestObserverCallerGivesUp: a caller whose context ends stops waiting; the read goes on
// for the others.
func TestObserverCallerGivesUp(t *testing.T) {
	release, started := make(chan struct{}), make(chan int, 10)
	o := NewObserver(t.Context(), listedNodes(release, started))

	ctx, cancel := context.WithCancel(t.Context())
	gaveUp := make(chan error, 1)

	go func() {
		_, err := o.Observe(ctx)
		gaveUp <- err
	}()

	require.Equal(t, 1, <-started)

	other := make(chan []Running, 1)

	go func() {
		running, err := o.Observe(t.Context())
		assert.NoError(t, err)
		other <- running
	}()

	cancel()
	require.ErrorIs(t, <-gaveUp, context.Canceled)

	release <- struct{}{}
	require.Equal(t, 2, <-started)
	release <- struct{}{}
	assert.Equal(t, "v1.36.2", kubeletOf(t, <-other))
}
