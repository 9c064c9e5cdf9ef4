package engine

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/render"
)

// The engine's node messages (the operation's record) say a dropped digest.
func TestDescribeChangesSaysADroppedDigest(t *testing.T) {
	digest := "sha256:" + strings.Repeat("ab", 32)

	assert.Equal(t, "kube-apiserver v1.35.4 -> v1.36.3 (digest "+digest+" dropped), kubelet v1.35.4 -> v1.36.3", describeChanges([]render.Change{
		{Component: discovery.APIServer, From: "registry.k8s.io/kube-apiserver:v1.35.4@" + digest, To: "registry.k8s.io/kube-apiserver:v1.36.3", DroppedDigest: digest},
		{Component: discovery.Kubelet, From: "ghcr.io/siderolabs/kubelet:v1.35.4", To: "ghcr.io/siderolabs/kubelet:v1.36.3"},
	}))
}
