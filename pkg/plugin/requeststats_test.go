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
	// The fake Kubernetes client makes no HTTP request; every Talos node is read once.
	assert.Equal(t, "request stats: kubernetes 0 requests ()\n"+
		"request stats: talos 10 calls to 5 nodes (MachineConfig 5, Version 5)\n", stderr)

	_, stderr, code = runWith(t, fakeDeps(fixture(), nil), "plan", "kubernetes", "--to", "v1.36.3", "-o", "json")
	assert.Equal(t, ExitOK, code, stderr)
	assert.Empty(t, stderr, "no counts without the flag")
}
