package job

import (
	"strconv"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// withResourceVersions makes the fake clientset check and bump resourceVersions on
// updates of the given resources, as the apiserver does: an update that carries a stale
// resourceVersion is a conflict. (The fake's tracker alone overwrites.)
func withResourceVersions(client *fake.Clientset, resources ...schema.GroupVersionResource) {
	for _, gvr := range resources {
		// A create gets a resourceVersion, as from the apiserver: an update carrying the one
		// its create returned is then checked like any other (without it, client-go's
		// leader elector's first renewal would overwrite whatever was written since).
		client.PrependReactor("create", gvr.Resource, func(a k8stesting.Action) (bool, runtime.Object, error) {
			c := a.(k8stesting.CreateAction)
			obj := c.GetObject().DeepCopyObject()

			m, err := meta.Accessor(obj)
			if err != nil {
				return true, nil, err
			}

			if m.GetName() == "" {
				return false, nil, nil
			}

			if m.GetResourceVersion() == "" {
				m.SetResourceVersion("1")
			}

			if err := client.Tracker().Create(gvr, obj, c.GetNamespace()); err != nil {
				return true, nil, err
			}

			return true, obj, nil
		})
		client.PrependReactor("update", gvr.Resource, func(a k8stesting.Action) (bool, runtime.Object, error) {
			u := a.(k8stesting.UpdateAction)
			obj := u.GetObject().DeepCopyObject()

			m, err := meta.Accessor(obj)
			if err != nil {
				return true, nil, err
			}

			cur, err := client.Tracker().Get(gvr, u.GetNamespace(), m.GetName())
			if err != nil {
				return true, nil, err
			}

			cm, _ := meta.Accessor(cur)
			if m.GetResourceVersion() != "" && m.GetResourceVersion() != cm.GetResourceVersion() {
				return true, nil, apierrors.NewConflict(gvr.GroupResource(), m.GetName(), errStale)
			}

			n, _ := strconv.Atoi(cm.GetResourceVersion())
			m.SetResourceVersion(strconv.Itoa(n + 1))

			if err := client.Tracker().Update(gvr, obj, u.GetNamespace()); err != nil {
				return true, nil, err
			}

			return true, obj, nil
		})
	}
}

var errStale = apierrors.NewBadRequest("the object has been modified; please apply your changes to the latest version and try again")

var (
	leasesResource     = schema.GroupVersionResource{Group: "coordination.k8s.io", Version: "v1", Resource: "leases"}
	configmapsResource = schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}
)
