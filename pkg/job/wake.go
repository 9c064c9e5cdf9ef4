package job

import (
	"context"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
)

// Wake paces a loop that reads one object, or the objects of one selector: Next
// returns at their next change (a watch), or once the loop's poll passed. A watch that
// ends is opened again, and that turn waits the poll; a watch that cannot start
// (RBAC refusing it, say) leaves the poll alone. Opened before the loop's first
// read, it misses no change after that read.
type Wake struct {
	open   func(context.Context, metav1.ListOptions) (watch.Interface, error)
	opts   metav1.ListOptions
	events <-chan watch.Event
	stop   func()
}

// newWake starts watching the object called name with open.
func newWake(ctx context.Context, open func(context.Context, metav1.ListOptions) (watch.Interface, error), name string) *Wake {
	return newWakeOn(ctx, open, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String()})
}

// newWakeOn starts watching the objects opts selects with open.
func newWakeOn(ctx context.Context, open func(context.Context, metav1.ListOptions) (watch.Interface, error), opts metav1.ListOptions) *Wake {
	w := &Wake{open: open, opts: opts}
	w.start(ctx)

	return w
}

func (w *Wake) start(ctx context.Context) {
	w.events, w.stop = nil, func() {}

	iw, err := w.open(ctx, w.opts)
	if err == nil {
		w.events, w.stop = iw.ResultChan(), iw.Stop
	}
}

// Next returns at the object's next change, once poll passed, or when ctx ends.
func (w *Wake) Next(ctx context.Context, poll time.Duration) {
	timer := time.NewTimer(poll)
	defer timer.Stop()

	select {
	case <-ctx.Done():
	case _, open := <-w.events:
		if open {
			return
		}

		w.stop()
		w.start(ctx)

		select {
		case <-ctx.Done():
		case <-timer.C:
		}
	case <-timer.C:
	}
}

// Stop ends the watch.
func (w *Wake) Stop() { w.stop() }
