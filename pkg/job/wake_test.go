package job

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// TestWakeOpensAnEndedWatchAgain: a change wakes Next at once; a watch that
// ends is opened again, and that turn waits out the poll rather than spin.
func TestWakeOpensAnEndedWatchAgain(t *testing.T) {
	kube := fake.NewClientset()
	watchers := make(chan *watch.FakeWatcher, 2)

	kube.PrependWatchReactor("configmaps", func(k8stesting.Action) (bool, watch.Interface, error) {
		w := watch.NewFake()
		watchers <- w

		return true, w, nil
	})

	ctx := context.Background()
	wake := (&Control{Kube: kube, Namespace: DefaultNamespace}).WatchState(ctx)
	defer wake.Stop()

	first := <-watchers

	go first.Modify(&runtime.Unknown{})

	start := time.Now()
	wake.Next(ctx, time.Hour)
	assert.Less(t, time.Since(start), time.Minute, "woken by the change")

	first.Stop()

	start = time.Now()
	wake.Next(ctx, 50*time.Millisecond)
	assert.GreaterOrEqual(t, time.Since(start), 50*time.Millisecond, "the ended watch's turn waits the poll")

	select {
	case second := <-watchers:
		go second.Modify(&runtime.Unknown{})

		start = time.Now()
		wake.Next(ctx, time.Hour)
		assert.Less(t, time.Since(start), time.Minute, "the new watch wakes it")
	default:
		t.Fatal("the ended watch was not opened again")
	}
}
