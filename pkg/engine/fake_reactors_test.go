package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	k8stesting "k8s.io/client-go/testing"

	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/render"
)

// listPodsByNode serves the drain's LIST of a node's pods, which selects by
// field (the fake clientset ignores field selectors).
func (f *fakeCluster) listPodsByNode(action k8stesting.Action) (bool, runtime.Object, error) {
	list, ok := action.(k8stesting.ListActionImpl)
	if !ok || list.ListRestrictions.Fields == nil || list.ListRestrictions.Fields.Empty() {
		return false, nil, nil
	}

	obj, err := f.cs.Tracker().List(podsGVR, podGVK, list.GetNamespace())
	if err != nil {
		return true, nil, err
	}

	all, _ := obj.(*corev1.PodList)
	out := &corev1.PodList{}

	for _, p := range all.Items {
		if list.ListRestrictions.Fields.Matches(fields.Set{"spec.nodeName": p.Spec.NodeName}) &&
			list.ListRestrictions.Labels.Matches(labels.Set(p.Labels)) {
			out.Items = append(out.Items, p)
		}
	}

	return true, out, nil
}

// evict serves pods/eviction: the pod goes at once, or a budget refuses.
func (f *fakeCluster) evict(action k8stesting.Action) (bool, runtime.Object, error) {
	create, ok := action.(k8stesting.CreateActionImpl)
	if !ok || create.GetSubresource() != "eviction" {
		return false, nil, nil
	}

	ev, _ := create.GetObject().(*policyv1.Eviction)

	if f.pdbBlocks {
		return true, nil, apierrors.NewTooManyRequests("Cannot evict pod as it would violate the pod's disruption budget.", 0)
	}

	obj, err := f.cs.Tracker().Get(podsGVR, ev.Namespace, ev.Name)
	if err != nil {
		return true, nil, err
	}

	pod, _ := obj.(*corev1.Pod)

	f.mu.Lock()
	graceful := f.evictGraceful
	f.mu.Unlock()

	if graceful {
		if pod.DeletionTimestamp != nil {
			return true, nil, nil
		}

		pod = pod.DeepCopy()
		pod.DeletionTimestamp = &metav1.Time{Time: time.Now()}

		if err := f.cs.Tracker().Update(podsGVR, pod, ev.Namespace); err != nil {
			return true, nil, err
		}

		f.mu.Lock()
		f.terminating = append(f.terminating, pod.Spec.NodeName+" "+ev.Namespace+"/"+ev.Name)
		f.evictions = append(f.evictions, pod.Spec.NodeName+" "+ev.Namespace+"/"+ev.Name)
		onTerminating := f.onTerminating
		f.mu.Unlock()

		if onTerminating != nil {
			onTerminating()
		}

		return true, nil, nil
	}

	if err := f.cs.Tracker().Delete(podsGVR, ev.Namespace, ev.Name); err != nil {
		return true, nil, err
	}

	f.mu.Lock()
	f.evictions = append(f.evictions, pod.Spec.NodeName+" "+ev.Namespace+"/"+ev.Name)
	onEvict := f.onEvict
	f.mu.Unlock()

	if onEvict != nil {
		onEvict(ev.Namespace, ev.Name)
	}

	return true, nil, nil
}

// applyManifest serves the server-side apply of the bootstrap manifests: the
// kube-proxy DaemonSet takes the new image and rolls out.
func (f *fakeCluster) applyManifest(action k8stesting.Action) (bool, runtime.Object, error) {
	patch, _ := action.(k8stesting.PatchActionImpl)

	obj := &unstructured.Unstructured{}
	if err := obj.UnmarshalJSON(patch.GetPatch()); err != nil {
		return true, nil, err
	}

	force := patch.PatchOptions.Force != nil && *patch.PatchOptions.Force
	key := fmt.Sprintf("%s %s/%s", obj.GetKind(), patch.GetNamespace(), obj.GetName())
	gr := schema.GroupResource{Group: patch.GetResource().Group, Resource: patch.GetResource().Resource}

	f.mu.Lock()
	owner, owned := f.manifestOwners[key]
	forbidden := f.manifestForbidden[key]
	f.mu.Unlock()

	if owned && obj.GetKind() == "DaemonSet" && obj.GetName() == "kube-proxy" {
		ds, err := f.cs.AppsV1().DaemonSets("kube-system").Get(context.Background(), "kube-proxy", metav1.GetOptions{})
		require.NoError(f.t, err)

		owned = ds.Spec.Template.Spec.Containers[0].Image != kubeProxyImage([]*unstructured.Unstructured{obj})
	}

	switch {
	case forbidden:
		return true, nil, apierrors.NewForbidden(gr, obj.GetName(), errors.New("the runner may not patch it"))
	case owned && !force:
		manager, op, _ := strings.Cut(owner, "/")
		msg := fmt.Sprintf("conflict with %q", manager)

		if op == "Update" {
			msg += " using " + obj.GetAPIVersion()
		}

		return true, nil, apierrors.NewApplyConflict([]metav1.StatusCause{{
			Type: metav1.CauseTypeFieldManagerConflict, Message: msg, Field: ".spec.template",
		}}, fmt.Sprintf("Apply failed with 1 conflict: %s: .spec.template", msg))
	}

	if len(patch.PatchOptions.DryRun) > 0 {
		f.mu.Lock()
		f.dryRuns++
		f.mu.Unlock()

		return true, obj, nil
	}

	f.mu.Lock()
	f.applied = append(f.applied, fmt.Sprintf("%s %t %s %s/%s", patch.PatchOptions.FieldManager, force, obj.GetKind(), patch.GetNamespace(), obj.GetName()))
	f.appliedObjects = append(f.appliedObjects, obj.DeepCopy())
	f.mu.Unlock()

	if obj.GetKind() == "DaemonSet" && obj.GetName() == "kube-proxy" {
		var ds appsv1.DaemonSet
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj.Object, &ds); err != nil {
			return true, nil, err
		}

		f.rollKubeProxy(ds.Spec.Template.Spec.Containers[0].Image)
	}

	return true, obj, nil
}

// rollKubeProxy sets the DaemonSet's image and, unless stuck, rolls its pods.
func (f *fakeCluster) rollKubeProxy(image string) {
	ctx := context.Background()

	ds, err := f.cs.AppsV1().DaemonSets("kube-system").Get(ctx, "kube-proxy", metav1.GetOptions{})
	require.NoError(f.t, err)

	if ds.Spec.Template.Spec.Containers[0].Image == image {
		return
	}

	ds.Spec.Template.Spec.Containers[0].Image = image
	ds.Generation++
	ds.Status.ObservedGeneration = ds.Generation
	ds.Status.UpdatedNumberScheduled, ds.Status.NumberAvailable = 0, 0

	if !f.rolloutStuck {
		ds.Status.UpdatedNumberScheduled, ds.Status.NumberAvailable = ds.Status.DesiredNumberScheduled, ds.Status.DesiredNumberScheduled

		for _, m := range f.machines {
			pod, err := f.cs.CoreV1().Pods("kube-system").Get(ctx, "kube-proxy-"+m.name, metav1.GetOptions{})
			require.NoError(f.t, err)

			pod.Spec.Containers[0].Image = image
			_, err = f.cs.CoreV1().Pods("kube-system").Update(ctx, pod, metav1.UpdateOptions{})
			require.NoError(f.t, err)
			f.record(m.name, string(discovery.KubeProxy), render.TagOf(image))
		}
	}

	_, err = f.cs.AppsV1().DaemonSets("kube-system").Update(ctx, ds, metav1.UpdateOptions{})
	require.NoError(f.t, err)
}

// releaseEvicted ends the pods of node ("" for every node) evicted
// gracefully (evictGraceful) that are still Terminating: they are deleted.
func (f *fakeCluster) releaseEvicted(node string) {
	f.mu.Lock()

	var pods []string

	f.terminating = slices.DeleteFunc(f.terminating, func(key string) bool {
		on, pod, _ := strings.Cut(key, " ")
		if node != "" && on != node {
			return false
		}

		pods = append(pods, pod)

		return true
	})
	f.mu.Unlock()

	for _, key := range pods {
		ns, name, _ := strings.Cut(key, "/")
		_ = f.cs.Tracker().Delete(podsGVR, ns, name)
	}
}

// workloadsOn is how many pods a ReplicaSet owns on node, Terminating or not.
func (f *fakeCluster) workloadsOn(node string) int {
	obj, err := f.cs.Tracker().List(podsGVR, schema.GroupVersionKind{Version: "v1", Kind: "Pod"}, "")
	if err != nil {
		return -1
	}

	n := 0

	for _, p := range obj.(*corev1.PodList).Items {
		if p.Spec.NodeName == node && len(p.OwnerReferences) > 0 && p.OwnerReferences[0].Kind == "ReplicaSet" {
			n++
		}
	}

	return n
}
