package job

import (
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

type controlFixture struct {
	kube *fake.Clientset
	dyn  *dynamicfake.FakeDynamicClient
	ctl  *Control
}

func newControl(t *testing.T, now time.Time, objs ...runtime.Object) *controlFixture {
	t.Helper()

	scheme := runtime.NewScheme()
	f := &controlFixture{
		kube: fake.NewClientset(objs...),
		dyn:  dynamicfake.NewSimpleDynamicClientWithCustomListKinds(scheme, map[schema.GroupVersionResource]string{TalosAccountResource: "ServiceAccountList"}),
	}
	withResourceVersions(f.kube, leasesResource, configmapsResource)

	// The dynamic fake's apply does not create: do what the apiserver does.
	f.dyn.PrependReactor("patch", "serviceaccounts", func(a k8stesting.Action) (bool, runtime.Object, error) {
		p := a.(k8stesting.PatchAction)
		u := &unstructured.Unstructured{}

		if err := u.UnmarshalJSON(p.GetPatch()); err != nil {
			return true, nil, err
		}

		if _, err := f.dyn.Tracker().Get(TalosAccountResource, p.GetNamespace(), p.GetName()); apierrors.IsNotFound(err) {
			return true, u, f.dyn.Tracker().Create(TalosAccountResource, u, p.GetNamespace())
		}

		return true, u, f.dyn.Tracker().Update(TalosAccountResource, u, p.GetNamespace())
	})

	f.ctl = &Control{
		Kube: f.kube, Dynamic: f.dyn, Namespace: "ichor-system",
		CredentialsTimeout: 300 * time.Millisecond, StopTimeout: 2 * time.Second, Poll: 20 * time.Millisecond,
		Now: func() time.Time { return now },
	}

	return f
}

func heldLease(holder string, renewed time.Time) *coordinationv1.Lease {
	duration := int32(15)
	r := metav1.NewMicroTime(renewed)

	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: LockName, Namespace: LockNamespace},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: &holder, RenewTime: &r, AcquireTime: &r, LeaseDurationSeconds: &duration},
	}
}

func runnerPod(name, job string, phase corev1.PodPhase) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: "ichor-system", CreationTimestamp: metav1.NewTime(t0),
			Labels: map[string]string{"job-name": job, LabelOperation: "op-1", LabelManagedBy: AppName},
		},
		Status: corev1.PodStatus{Phase: phase},
	}
}

func runnerJob(name string, conditions ...batchv1.JobCondition) *batchv1.Job {
	return &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ichor-system", Labels: map[string]string{LabelOperation: "op-1", LabelManagedBy: AppName}},
		Status:     batchv1.JobStatus{Conditions: conditions},
	}
}

func talosSecret() *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: TalosAccountName, Namespace: "ichor-system"},
		Data:       map[string][]byte{TalosconfigKey: []byte("context: x")},
	}
}

// testAccess gives the runner rules in kube-system, so that it has a Role there.
func testAccess() ManifestAccess {
	return ManifestAccess{Namespaced: map[string][]rbacv1.PolicyRule{
		"kube-system": {{APIGroups: []string{"apps"}, Resources: []string{"daemonsets"}, Verbs: ManifestVerbs(), ResourceNames: []string{"kube-proxy"}}},
	}}
}
