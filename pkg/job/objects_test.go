package job

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/version"
)

var update = flag.Bool("update", false, "rewrite manifests/ and testdata, then fail so a re-record cannot pass silently")

func TestJobSpec(t *testing.T) {
	j := Job(JobParams{Namespace: "ichor-system", Operation: "kubernetes-v1-36-3-abcde", Attempt: 2, Image: "ghcr.io/ichor-dev/kubectl-ichor:v0.1.0", Credentials: api.CredentialsLocal})

	assert.Equal(t, "ichor-kubernetes-v1-36-3-abcde-2", j.Name)
	assert.Equal(t, "kubernetes-v1-36-3-abcde", j.Labels[LabelOperation])
	assert.Equal(t, int32(BackoffLimit), *j.Spec.BackoffLimit)
	assert.Equal(t, int32(TTLAfterFinished), *j.Spec.TTLSecondsAfterFinished)

	rules := j.Spec.PodFailurePolicy.Rules
	require.Len(t, rules, 3)
	assert.Equal(t, batchv1.PodFailurePolicyActionIgnore, rules[0].Action, "an eviction costs no retry")
	assert.Equal(t, corev1.DisruptionTarget, rules[0].OnPodConditions[0].Type)
	assert.Equal(t, batchv1.PodFailurePolicyActionIgnore, rules[1].Action, "a hand-over costs no retry")
	assert.Equal(t, []int32{ExitHandedOver}, rules[1].OnExitCodes.Values)
	assert.Equal(t, ContainerName, *rules[1].OnExitCodes.ContainerName)
	assert.Equal(t, batchv1.PodFailurePolicyActionFailJob, rules[2].Action, "a pause is never retried")
	assert.Equal(t, []int32{ExitPaused, ExitFinal}, rules[2].OnExitCodes.Values)
	assert.Equal(t, ContainerName, *rules[2].OnExitCodes.ContainerName)
	assert.Nil(t, j.Spec.Completions, "a pod's success ends the Job: a hand-over exits otherwise")
	assert.Equal(t, int32(1), *j.Spec.Parallelism, "set, or the API server sets completions to 1, which allows no second pod")

	pod := j.Spec.Template.Spec
	assert.Equal(t, "kubernetes-v1-36-3-abcde", j.Spec.Template.Labels[LabelOperation])
	assert.Equal(t, corev1.RestartPolicyNever, pod.RestartPolicy)
	assert.Equal(t, RunnerName, pod.ServiceAccountName)
	assert.Equal(t, "node-role.kubernetes.io/control-plane", pod.Tolerations[0].Key)
	assert.True(t, *pod.SecurityContext.RunAsNonRoot)
	assert.NotZero(t, *pod.SecurityContext.RunAsUser)

	c := pod.Containers[0]
	assert.Equal(t, ContainerName, c.Name)
	assert.Equal(t, "ghcr.io/ichor-dev/kubectl-ichor:v0.1.0", c.Image)
	assert.Equal(t, []string{"/usr/local/bin/kubectl-ichor", "run", "--operation", "kubernetes-v1-36-3-abcde", "--namespace", "ichor-system"}, c.Command)
	assert.True(t, *c.SecurityContext.ReadOnlyRootFilesystem)
	assert.False(t, *c.SecurityContext.AllowPrivilegeEscalation)
	assert.Equal(t, []corev1.Capability{"ALL"}, c.SecurityContext.Capabilities.Drop)
	assert.False(t, c.Resources.Requests.Cpu().IsZero())
	assert.False(t, c.Resources.Limits.Memory().IsZero())

	var env []string
	for _, e := range c.Env {
		env = append(env, e.Name+"="+e.ValueFrom.FieldRef.FieldPath)
	}

	assert.Equal(t, []string{"POD_NAME=metadata.name", "POD_NAMESPACE=metadata.namespace", "NODE_NAME=spec.nodeName"}, env)
	assert.Equal(t, TalosconfigDir, c.VolumeMounts[0].MountPath)
	assert.Equal(t, LocalTalosconfigName, pod.Volumes[0].Secret.SecretName, "local credentials mount the copied talosconfig")
	assert.True(t, *pod.Volumes[0].Secret.Optional, "the end deletes them: a container restarted after it must start")

	j = Job(JobParams{Namespace: "ns", Operation: "x", Attempt: 1, Image: "i", Credentials: api.CredentialsServiceAccount})
	assert.Equal(t, TalosAccountName, j.Spec.Template.Spec.Volumes[0].Secret.SecretName)
}

// flatRules lists rules one permission a line: "verb resource.group names".
func flatRules(rules []rbacv1.PolicyRule) []string {
	var out []string

	for _, r := range rules {
		for _, v := range r.Verbs {
			for _, res := range append(r.Resources, r.NonResourceURLs...) {
				s := v + " " + res
				if len(r.APIGroups) > 0 && r.APIGroups[0] != "" {
					s += "." + r.APIGroups[0]
				}

				if len(r.ResourceNames) > 0 {
					s += " " + strings.Join(r.ResourceNames, ",")
				}

				out = append(out, s)
			}
		}
	}

	slices.Sort(out)

	return out
}

// TestRBACIsExact lists every permission the runner gets besides those computed from the
// bootstrap manifests: a change here must be a change of what the runner uses. None of
// them creates, changes or binds a role.
func TestRBACIsExact(t *testing.T) {
	assert.Equal(t, []string{
		"create events",
		"create pods/eviction",
		"delete clusterroles.rbac.authorization.k8s.io ichor-runner:upgrades",
		"get /metrics",
		"get daemonsets.apps",
		"get nodes",
		"get pods",
		"list daemonsets.apps",
		"list nodes",
		"list poddisruptionbudgets.policy",
		"list pods",
		"patch nodes",
		"watch daemonsets.apps",
		"watch nodes",
		"watch pods",
	}, flatRules(ClusterRoleRules("upgrades")))

	assert.Equal(t, []string{
		"delete secrets ichor-talosconfig,ichor-talos",
		"delete serviceaccounts.talos.dev ichor-talos",
		"get configmaps ichor-state",
		"get jobs.batch",
		"patch jobs.batch",
		"update configmaps ichor-state",
	}, flatRules(RoleRules()))

	assert.Equal(t, []string{
		"create leases.coordination.k8s.io",
		"get leases.coordination.k8s.io ichor-lock",
		"update leases.coordination.k8s.io ichor-lock",
		"watch leases.coordination.k8s.io ichor-lock",
	}, flatRules(LockRules()))

	for _, rules := range [][]rbacv1.PolicyRule{ClusterRoleRules("upgrades"), RoleRules(), LockRules()} {
		for _, r := range rules {
			for _, list := range [][]string{r.APIGroups, r.Resources, r.Verbs, r.ResourceNames, r.NonResourceURLs} {
				assert.NotContains(t, list, "*", "no wildcard: %+v", r)
			}

			assert.NotContains(t, r.Verbs, "escalate")
			assert.NotContains(t, r.Verbs, "bind")
		}
	}
}

func TestRunnerObjects(t *testing.T) {
	access := ManifestAccess{
		Cluster: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"namespaces"}, Verbs: ManifestVerbs(), ResourceNames: []string{"x"}}},
		Namespaced: map[string][]rbacv1.PolicyRule{
			"kube-system": {{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: ManifestVerbs(), ResourceNames: []string{"s"}}},
			"upgrades":    {{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: ManifestVerbs(), ResourceNames: []string{"c"}}},
		},
	}
	owner := &metav1.OwnerReference{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRole", Name: "ichor-runner:upgrades", UID: "u1"}

	objs := RunnerObjects("upgrades", access, owner)

	cr, ok := objs[0].(*rbacv1.ClusterRole)
	require.True(t, ok, "the ClusterRole first: it owns the others")
	assert.Equal(t, "ichor-runner:upgrades", cr.Name)
	assert.Empty(t, cr.OwnerReferences)
	assert.Contains(t, flatRules(cr.Rules), "patch namespaces x")

	var names []string

	for _, obj := range objs[1:] {
		m, err := meta.Accessor(obj)
		require.NoError(t, err)
		if _, account := obj.(*corev1.ServiceAccount); account {
			assert.Empty(t, m.GetOwnerReferences(), "the ServiceAccount outlives the ClusterRole: a container restarted after the end starts with it")
		} else {
			assert.Equal(t, []metav1.OwnerReference{*owner}, m.GetOwnerReferences(), "%s is owned by the ClusterRole", m.GetName())
		}
		assert.Equal(t, "upgrades", m.GetLabels()[LabelRunnerNamespace])

		names = append(names, fmt.Sprintf("%T %s/%s", obj, m.GetNamespace(), m.GetName()))

		switch o := obj.(type) {
		case *rbacv1.ClusterRoleBinding:
			assert.Equal(t, "upgrades", o.Subjects[0].Namespace)
			assert.Equal(t, cr.Name, o.RoleRef.Name)
		case *rbacv1.RoleBinding:
			assert.Equal(t, "upgrades", o.Subjects[0].Namespace)
			assert.Equal(t, RunnerName, o.Subjects[0].Name)
		case *rbacv1.Role:
			if o.Namespace == "kube-system" {
				assert.Equal(t, []string{
					"create leases.coordination.k8s.io", "create secrets s", "get leases.coordination.k8s.io ichor-lock",
					"get secrets s", "patch secrets s", "update leases.coordination.k8s.io ichor-lock", "watch leases.coordination.k8s.io ichor-lock",
				}, flatRules(o.Rules), "the manifests' kube-system objects and the cluster's one lock")
			} else {
				assert.Contains(t, flatRules(o.Rules), "patch configmaps c", "the manifests' rules of the runner's own namespace join its Role")
				assert.Contains(t, flatRules(o.Rules), "update configmaps ichor-state")
			}
		}
	}

	assert.Equal(t, []string{
		"*v1.ClusterRoleBinding /ichor-runner:upgrades",
		"*v1.ServiceAccount upgrades/ichor-runner",
		"*v1.Role upgrades/ichor-runner",
		"*v1.RoleBinding upgrades/ichor-runner",
		"*v1.Role kube-system/ichor-runner:upgrades",
		"*v1.RoleBinding kube-system/ichor-runner:upgrades",
	}, names)

	sa := TalosAccount("upgrades")
	roles, _, _ := unstructured.NestedStringSlice(sa.Object, "spec", "roles")
	assert.Equal(t, []string{"os:admin"}, roles)
	assert.Equal(t, "talos.dev/v1alpha1", sa.GetAPIVersion())
}

// TestManifests keeps manifests/ in step with the code that creates the objects.
func TestManifests(t *testing.T) {
	files, err := Manifests(DefaultNamespace, version.Repository+":v0.1.0")
	require.NoError(t, err)

	for _, f := range files {
		got, err := f.Render()
		require.NoError(t, err)

		path := filepath.Join("..", "..", "manifests", f.Name)

		if *update {
			require.NoError(t, os.WriteFile(path, got, 0o644))
			t.Errorf("updated %s: check the diff and run again without -update", path)

			continue
		}

		want, err := os.ReadFile(path)
		require.NoError(t, err, "missing %s: run go test ./pkg/job -run TestManifests -update", path)
		assert.Equal(t, string(want), string(got), "%s is out of step with pkg/job: run go test ./pkg/job -run TestManifests -update", path)
	}
}

func TestOperationIDs(t *testing.T) {
	a, b := NewOperationID("kubernetes", "v1.36.3"), NewOperationID("kubernetes", "v1.36.3")
	assert.NotEqual(t, a, b)
	assert.Regexp(t, `^kubernetes-v1-36-3-[a-z0-9]{5}$`, a)
	assert.LessOrEqual(t, len(JobName(a, 99)), 63)
}
