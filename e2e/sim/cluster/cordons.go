package cluster

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/ichor-dev/kubectl-ichor/e2e/sim/events"
)

// recordCordons writes an events.Cordon line whenever a Node's
// spec.unschedulable changes (and for a Node first seen cordoned), until ctx
// ends: whoever cordons, the events log says so, so a test can tell that a
// node was never made unavailable.
func recordCordons(ctx context.Context, client kubernetes.Interface, ev *events.Log) error {
	f := informers.NewSharedInformerFactory(client, 0)
	inf := f.Core().V1().Nodes().Informer()
	write := func(n *corev1.Node) {
		v := events.Uncordoned
		if n.Spec.Unschedulable {
			v = events.Cordoned
		}
		ev.Start(n.Name, events.Cordon, v)
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if n, ok := obj.(*corev1.Node); ok && n.Spec.Unschedulable {
				write(n)
			}
		},
		UpdateFunc: func(old, obj any) {
			o, ok1 := old.(*corev1.Node)
			n, ok2 := obj.(*corev1.Node)
			if ok1 && ok2 && o.Spec.Unschedulable != n.Spec.Unschedulable {
				write(n)
			}
		},
	}); err != nil {
		return err
	}
	f.Start(ctx.Done())
	return nil
}
