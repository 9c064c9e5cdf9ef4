package plugin

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

func TestRequestStatsKubernetes(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"kind":"NodeList","apiVersion":"v1","items":[]}`))
	}))
	defer srv.Close()

	stats := newRequestStats()
	client, err := kubernetes.NewForConfig(stats.wrapKube(&rest.Config{Host: srv.URL}))
	require.NoError(t, err)

	for range 2 {
		_, err := client.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{LabelSelector: "a=b"})
		require.NoError(t, err)
	}

	var out bytes.Buffer
	stats.print(&out)
	assert.Equal(t, "request stats: kubernetes 2 requests (GET /api/v1/nodes 2)\n"+
		"request stats: talos 0 calls to 0 nodes ()\n", out.String())
}

func TestRequestStatsFlag(t *testing.T) {
	stdout, stderr, code := runWith(t, fakeDeps(fixture(), nil), "plan", "kubernetes", "--to", "v1.36.3", "--request-stats", "-o", "json")
	assert.Equal(t, ExitOK, code, stderr)
	assert.NotEmpty(t, stdout)
	// The fake Kubernetes client makes no HTTP request; every Talos node is read once,
	// and one control plane's bootstrap manifests.
	assert.Equal(t, "request stats: kubernetes 0 requests ()\n"+
		"request stats: talos 11 calls to 5 nodes (MachineConfig 5, Manifests 1, Version 5)\n", stderr)

	plain, stderr, code := runWith(t, fakeDeps(fixture(), nil), "plan", "kubernetes", "--to", "v1.36.3", "-o", "json")
	assert.Equal(t, ExitOK, code, stderr)
	assert.Empty(t, stderr, "no counts without the flag")
	assert.JSONEq(t, plain, stdout, "counting changes nothing of what plan reads (it once left out the manifests)")
}

func TestResourceKey(t *testing.T) {
	tests := []struct {
		name, method, url, want string
	}{
		{name: "list", method: "GET", url: "/api/v1/nodes?limit=500", want: "GET /api/v1/nodes"},
		{name: "watch", method: "GET", url: "/api/v1/nodes?watch=true&resourceVersion=7", want: "WATCH /api/v1/nodes"},
		{name: "get by name", method: "GET", url: "/api/v1/nodes/worker-7", want: "GET /api/v1/nodes/{name}"},
		{name: "namespaced", method: "PUT", url: "/api/v1/namespaces/ichor-system/configmaps/ichor-state", want: "PUT /api/v1/namespaces/ichor-system/configmaps/{name}"},
		{name: "subresource", method: "POST", url: "/api/v1/namespaces/default/pods/web-1/eviction", want: "POST /api/v1/namespaces/default/pods/{name}/eviction"},
		{name: "group", method: "PUT", url: "/apis/coordination.k8s.io/v1/namespaces/ichor-system/leases/ichor-lock", want: "PUT /apis/coordination.k8s.io/v1/namespaces/ichor-system/leases/{name}"},
		{name: "namespaced list", method: "GET", url: "/apis/apps/v1/namespaces/kube-system/daemonsets", want: "GET /apis/apps/v1/namespaces/kube-system/daemonsets"},
		{name: "a namespace", method: "GET", url: "/api/v1/namespaces/ichor-system", want: "GET /api/v1/namespaces/{name}"},
		{name: "not a resource", method: "GET", url: "/metrics", want: "GET /metrics"},
	}

	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req := httptest.NewRequest(tc.method, tc.url, nil)
			assert.Equal(t, tc.want, resourceKey(req))
		})
	}
}
