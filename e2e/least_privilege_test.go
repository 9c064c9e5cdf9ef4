//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/job"
)

// runnerUser is the runner's ServiceAccount as the apiserver names it.
var runnerUser = "system:serviceaccount:" + jobNamespace + ":" + job.RunnerName

// adminConfig is c's admin REST config.
func adminConfig(t *testing.T, c *Cluster) *rest.Config {
	t.Helper()

	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	require.NoError(t, err)

	return cfg
}

// asRunner is a client of c that impersonates the runner's ServiceAccount (with the groups
// the apiserver gives a ServiceAccount's token).
func asRunner(t *testing.T, c *Cluster) kubernetes.Interface {
	t.Helper()

	cfg := adminConfig(t, c)
	cfg.Impersonate = rest.ImpersonationConfig{
		UserName: runnerUser,
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + jobNamespace, "system:authenticated"},
	}

	return kubernetes.NewForConfigOrDie(cfg)
}

// canI asks the apiserver what the runner may do (kubectl auth can-i --as).
func canI(t *testing.T, c *Cluster, args ...string) string {
	t.Helper()

	out, _ := c.kubectl(t, append([]string{"auth", "can-i", "--as", runnerUser}, args...)...)
	lines := strings.Split(strings.TrimSpace(out), "\n")

	return lines[len(lines)-1]
}

// runnerCredentials lists what is left of the runner's identity, permissions and Talos
// credentials in c ("kind namespace/name"). keepsRunnerAccount leaves out the runner's
// ServiceAccount, which a runner's own end keeps (bound to nothing) for a container
// restarted after it.
func runnerCredentials(ctx context.Context, t *testing.T, c *Cluster, keepsRunnerAccount bool) ([]string, error) {
	t.Helper()

	var left []string

	add := func(kind, ns, name string) { left = append(left, strings.TrimPrefix(kind+" "+ns+"/"+name, "/")) }
	rbac := c.Client.RbacV1()
	mine := labels.Set{job.LabelManagedBy: job.AppName}.String()

	crs, err := rbac.ClusterRoles().List(ctx, metav1.ListOptions{LabelSelector: mine})
	if err != nil {
		return nil, err
	}

	for _, o := range crs.Items {
		add("clusterrole", "", o.Name)
	}

	crbs, err := rbac.ClusterRoleBindings().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}

	for _, o := range crbs.Items {
		for _, s := range o.Subjects {
			if s.Kind == "ServiceAccount" && s.Namespace == jobNamespace {
				add("clusterrolebinding", "", o.Name)
			}
		}
	}

	roles, err := rbac.Roles("").List(ctx, metav1.ListOptions{LabelSelector: mine})
	if err != nil {
		return nil, err
	}

	for _, o := range roles.Items {
		add("role", o.Namespace, o.Name)
	}

	rbs, err := rbac.RoleBindings("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}

	for _, o := range rbs.Items {
		for _, s := range o.Subjects {
			if s.Kind == "ServiceAccount" && s.Namespace == jobNamespace {
				add("rolebinding", o.Namespace, o.Name)
			}
		}
	}

	sas, err := c.Client.CoreV1().ServiceAccounts(jobNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}

	for _, o := range sas.Items {
		if o.Name != "default" && (o.Name != job.RunnerName || !keepsRunnerAccount) {
			add("serviceaccount", o.Namespace, o.Name)
		}
	}

	secrets, err := c.Client.CoreV1().Secrets(jobNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}

	for _, o := range secrets.Items {
		add("secret", o.Namespace, o.Name)
	}

	talos, err := dynamic.NewForConfigOrDie(adminConfig(t, c)).Resource(job.TalosAccountResource).Namespace(jobNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}

	for _, o := range talos.Items {
		add("serviceaccount.talos.dev", o.GetNamespace(), o.GetName())
	}

	return left, nil
}

// requireNoCredentialLeft waits (bounded: the garbage collector deletes what the runner's
// ClusterRole owned) until nothing of the runner's credentials is left, and checks that the
// state stays and status reads it.
func requireNoCredentialLeft(t *testing.T, c *Cluster, phase api.Phase) {
	t.Helper()

	// A runner that succeeded keeps its ServiceAccount, bound to nothing (Runner.Run):
	// its rolebindings, checked here, are gone, and with them every right.
	succeeded := phase == api.PhaseSucceeded

	eventually(t, time.Minute, "no credential of the runner left", func(ctx context.Context) error {
		left, err := runnerCredentials(ctx, t, c, succeeded)
		if err != nil {
			return err
		}

		if len(left) > 0 {
			return fmt.Errorf("left: %s", strings.Join(left, ", "))
		}

		return nil
	})

	if succeeded {
		assert.Equal(t, "no", canI(t, c, "get", "configmaps", "-n", jobNamespace), "the runner's ServiceAccount may do nothing")
	}

	op := c.operation(t)
	assert.Equal(t, phase, op.Status.Phase, "the state stays")

	r := c.ichor(t, time.Minute, "status")
	r.requireExit(t, 0)
	assert.Contains(t, r.stdout, op.Spec.ID)
}

// TestJobLeastPrivilege launches a Kubernetes upgrade of a 3+2 cluster and, while its Job
// runs, tries every way its ServiceAccount could grant itself more than it was given
// (impersonating it against the real apiserver): each is Forbidden. It aborts the
// operation (nothing of the runner's credentials is left, the state stays), then launches
// it again and lets it finish through the KubeProxy stage's bootstrap manifests: once it
// succeeded, again no credential is left.
func TestJobLeastPrivilege(t *testing.T) {
	t.Parallel()

	c := startJobCluster(t)
	ctx := context.Background()

	// A Secret in kube-system that the manifests do not name.
	_, err := c.Client.CoreV1().Secrets("kube-system").Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "unrelated", Namespace: "kube-system"},
		StringData: map[string]string{"token": "secret"},
	}, metav1.CreateOptions{})
	require.NoError(t, err)

	r := c.ichor(t, 3*time.Minute, "upgrade", "kubernetes", "--to", "v1.36.3", "--yes", "--detach")
	r.requireExit(t, 0)

	first := c.operation(t)

	// What the runner may do: exactly its work, each bootstrap manifest object by name.
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"patch", "nodes"}, "yes"},
		{[]string{"create", "pods", "--subresource", "eviction", "-n", "default"}, "yes"},
		{[]string{"update", "configmaps/" + job.StateName, "-n", jobNamespace}, "yes"},
		{[]string{"patch", "jobs", "-n", jobNamespace}, "yes"},
		{[]string{"patch", "jobs", "-n", "default"}, "no"},
		{[]string{"create", "jobs", "-n", jobNamespace}, "no"},
		{[]string{"patch", "daemonsets/kube-proxy", "-n", "kube-system"}, "yes"},
		{[]string{"patch", "clusterroles/system:coredns"}, "yes"},
		{[]string{"bind", "clusterroles/system:node-proxier"}, "no"},
		{[]string{"patch", "daemonsets/other", "-n", "kube-system"}, "no"},
		{[]string{"patch", "daemonsets", "-n", "default"}, "no"},
		{[]string{"delete", "nodes"}, "no"},
		{[]string{"delete", "pods", "-n", "default"}, "no"},
		{[]string{"get", "secrets", "-n", "kube-system"}, "no"},
		{[]string{"patch", "secrets/unrelated", "-n", "kube-system"}, "no"},
		{[]string{"update", "configmaps/other", "-n", jobNamespace}, "no"},
		{[]string{"create", "clusterrolebindings"}, "no"},
		{[]string{"create", "clusterroles"}, "no"},
		{[]string{"create", "roles", "-n", "kube-system"}, "no"},
		{[]string{"create", "rolebindings", "-n", "kube-system"}, "no"},
		{[]string{"bind", "clusterroles/cluster-admin"}, "no"},
		{[]string{"bind", "clusterroles/system:coredns"}, "no"},
		{[]string{"escalate", "clusterroles/system:coredns"}, "no"},
		{[]string{"escalate", "clusterroles/cluster-admin"}, "no"},
		{[]string{"escalate", "roles", "-n", "kube-system"}, "no"},
		{[]string{"impersonate", "serviceaccounts"}, "no"},
		{[]string{"create", "serviceaccounts/token", "-n", "kube-system"}, "no"},
		{[]string{"patch", "clusterroles/" + job.ClusterRoleName(jobNamespace)}, "no"},
	} {
		assert.Equal(t, tc.want, canI(t, c, tc.args...), "can-i %s", strings.Join(tc.args, " "))
	}

	// Every escalation tried for real is Forbidden.
	runner := asRunner(t, c)
	rbac := runner.RbacV1()
	star := []rbacv1.PolicyRule{{APIGroups: []string{"*"}, Resources: []string{"*"}, Verbs: []string{"*"}}}
	starPatch := []byte(`{"rules":[{"apiGroups":["*"],"resources":["*"],"verbs":["*"]}]}`)
	self := []rbacv1.Subject{{Kind: "ServiceAccount", Name: job.RunnerName, Namespace: jobNamespace}}
	selfPatch := []byte(`{"subjects":[{"kind":"ServiceAccount","name":"` + job.RunnerName + `","namespace":"` + jobNamespace + `"}]}`)
	crb := func(name, role string) *rbacv1.ClusterRoleBinding {
		return &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
			Subjects:   self,
		}
	}

	for _, tc := range []struct {
		name string
		try  func() error
	}{
		{"patch a managed ClusterRole to grant *", func() error {
			_, err := rbac.ClusterRoles().Patch(ctx, "system:coredns", types.MergePatchType, starPatch, metav1.PatchOptions{})
			return err
		}},
		{"patch its own ClusterRole to grant *", func() error {
			_, err := rbac.ClusterRoles().Patch(ctx, job.ClusterRoleName(jobNamespace), types.MergePatchType, starPatch, metav1.PatchOptions{})
			return err
		}},
		{"create a ClusterRole granting *", func() error {
			_, err := rbac.ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "ichor-escalate"}, Rules: star}, metav1.CreateOptions{})
			return err
		}},
		{"bind cluster-admin to itself", func() error {
			_, err := rbac.ClusterRoleBindings().Create(ctx, crb("ichor-escalate", "cluster-admin"), metav1.CreateOptions{})
			return err
		}},
		{"bind a managed ClusterRole to itself", func() error {
			_, err := rbac.ClusterRoleBindings().Create(ctx, crb("ichor-escalate-coredns", "system:coredns"), metav1.CreateOptions{})
			return err
		}},
		{"bind a role the manifests bind to itself", func() error {
			_, err := rbac.ClusterRoleBindings().Create(ctx, crb("ichor-escalate-proxier", "system:node-proxier"), metav1.CreateOptions{})
			return err
		}},
		{"add itself to a binding of the manifests (to a built-in role)", func() error {
			_, err := rbac.ClusterRoleBindings().Patch(ctx, "kube-proxy", types.MergePatchType, selfPatch, metav1.PatchOptions{})
			return err
		}},
		{"add itself to a binding of the manifests (to a managed role)", func() error {
			_, err := rbac.ClusterRoleBindings().Patch(ctx, "system:coredns", types.MergePatchType, selfPatch, metav1.PatchOptions{})
			return err
		}},
		{"patch an unrelated kube-system Secret", func() error {
			_, err := runner.CoreV1().Secrets("kube-system").Patch(ctx, "unrelated", types.MergePatchType, []byte(`{"stringData":{"token":"mine"}}`), metav1.PatchOptions{})
			return err
		}},
		{"read an unrelated kube-system Secret", func() error {
			_, err := runner.CoreV1().Secrets("kube-system").Get(ctx, "unrelated", metav1.GetOptions{})
			return err
		}},
		{"create a Role in kube-system granting *", func() error {
			_, err := rbac.Roles("kube-system").Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "ichor-escalate", Namespace: "kube-system"}, Rules: star}, metav1.CreateOptions{})
			return err
		}},
		{"patch its own Role in kube-system to grant *", func() error {
			_, err := rbac.Roles("kube-system").Patch(ctx, job.BindingName(jobNamespace), types.MergePatchType, starPatch, metav1.PatchOptions{})
			return err
		}},
		{"bind cluster-admin in kube-system to itself", func() error {
			_, err := rbac.RoleBindings("kube-system").Create(ctx, &rbacv1.RoleBinding{
				ObjectMeta: metav1.ObjectMeta{Name: "ichor-escalate", Namespace: "kube-system"},
				RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"},
				Subjects:   self,
			}, metav1.CreateOptions{})
			return err
		}},
		{"patch its own Role in its namespace to grant *", func() error {
			_, err := rbac.Roles(jobNamespace).Patch(ctx, job.RunnerName, types.MergePatchType, starPatch, metav1.PatchOptions{})
			return err
		}},
		{"create a token for another ServiceAccount", func() error {
			_, err := runner.CoreV1().ServiceAccounts("kube-system").CreateToken(ctx, "kube-proxy", &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
			return err
		}},
	} {
		err := tc.try()
		assert.True(t, apierrors.IsForbidden(err), "%s: want Forbidden, got %v", tc.name, err)
	}

	// Abort: the Job's credentials go, the state stays.
	r = c.ichor(t, 5*time.Minute, "abort")
	r.requireExit(t, 0)
	assert.Contains(t, r.stdout, "removed the Job's credentials:")
	requireNoCredentialLeft(t, c, api.PhaseAborted)
	requireNothingCordoned(t, c)

	// Again, to the end: through the KubeProxy stage's bootstrap manifests, with the
	// permissions computed from them.
	r = c.ichor(t, 15*time.Minute, "upgrade", "kubernetes", "--to", "v1.36.3", "--yes")
	r.requireExit(t, 0)
	require.Regexp(t, `(?m)^Succeeded in \d`, r.stdout)

	second := c.operation(t)
	require.NotEqual(t, first.Spec.ID, second.Spec.ID)
	assert.Equal(t, api.PhaseSucceeded, second.Status.Phase)

	logs := c.ichor(t, time.Minute, "logs")
	logs.requireExit(t, 0)
	assert.Regexp(t, `applied \d+ bootstrap manifest object\(s\)`, logs.stdout, "the bootstrap manifests were synced by the runner")
	assert.Contains(t, logs.stdout, "deleted clusterrole "+job.ClusterRoleName(jobNamespace))

	ds, err := c.Client.AppsV1().DaemonSets("kube-system").Get(ctx, "kube-proxy", metav1.GetOptions{})
	require.NoError(t, err)
	assert.True(t, strings.HasSuffix(ds.Spec.Template.Spec.Containers[0].Image, ":v1.36.3"), "kube-proxy DaemonSet: %s", ds.Spec.Template.Spec.Containers[0].Image)

	requireNoCredentialLeft(t, c, api.PhaseSucceeded)
	requireNothingCordoned(t, c)

	// Nothing of the tries above was created or changed.
	for _, name := range []string{"kube-proxy", "system:coredns"} {
		b, err := c.Client.RbacV1().ClusterRoleBindings().Get(ctx, name, metav1.GetOptions{})
		require.NoError(t, err)

		for _, s := range b.Subjects {
			assert.NotEqual(t, job.RunnerName, s.Name, "clusterrolebinding %s", name)
		}
	}

	for _, name := range []string{"ichor-escalate", "ichor-escalate-coredns", "ichor-escalate-proxier"} {
		_, err := c.Client.RbacV1().ClusterRoleBindings().Get(ctx, name, metav1.GetOptions{})
		assert.True(t, apierrors.IsNotFound(err), name)
	}

	cr, err := c.Client.RbacV1().ClusterRoles().Get(ctx, "system:coredns", metav1.GetOptions{})
	require.NoError(t, err)

	for _, rule := range cr.Rules {
		assert.NotContains(t, rule.Verbs, "*")
	}

	s, err := c.Client.CoreV1().Secrets("kube-system").Get(ctx, "unrelated", metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, "secret", string(s.Data["token"]))

	// Abort of the succeeded operation is the way to clean up: refused no more, the
	// phase stays.
	r = c.ichor(t, time.Minute, "abort")
	r.requireExit(t, 0)
	assert.Contains(t, r.stdout, "stays Succeeded")
	assert.Equal(t, api.PhaseSucceeded, c.operation(t).Status.Phase)
}
