package render

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestImageReferences(t *testing.T) {
	for _, tc := range []struct {
		image      string
		repository string
		tag        string
		digest     string
		withTag    string // WithTag(image, "v1.36.3")
		err        string
	}{
		{
			image:      "registry.k8s.io/kube-apiserver:v1.35.2",
			repository: "registry.k8s.io/kube-apiserver",
			tag:        "v1.35.2",
			withTag:    "registry.k8s.io/kube-apiserver:v1.36.3",
		},
		{
			image:      "registry.example.com:5000/mirror/kube-apiserver:v1.35.2",
			repository: "registry.example.com:5000/mirror/kube-apiserver",
			tag:        "v1.35.2",
			withTag:    "registry.example.com:5000/mirror/kube-apiserver:v1.36.3",
		},
		{
			image:      "registry.example.com:5000/mirror/kubelet",
			repository: "registry.example.com:5000/mirror/kubelet",
			withTag:    "registry.example.com:5000/mirror/kubelet:v1.36.3",
		},
		{
			image:      "ghcr.io/siderolabs/kubelet:v1.35.2@" + testDigest,
			repository: "ghcr.io/siderolabs/kubelet",
			tag:        "v1.35.2",
			digest:     testDigest,
			withTag:    "ghcr.io/siderolabs/kubelet:v1.36.3",
		},
		{
			image:      "localhost:5000/kube-proxy@" + testDigest,
			repository: "localhost:5000/kube-proxy",
			digest:     testDigest,
			withTag:    "localhost:5000/kube-proxy:v1.36.3",
		},
		{
			image:      "kube-scheduler:v1.35.2",
			repository: "kube-scheduler",
			tag:        "v1.35.2",
			withTag:    "kube-scheduler:v1.36.3",
		},
		{image: "", err: "not an image reference"},
		{image: " registry.k8s.io/kube-apiserver:v1.35.2", err: "not an image reference"},
		{image: "registry.k8s.io/kube-apiserver:", err: `tag "" is not a valid tag`},
		{image: "registry.k8s.io/kube-apiserver:v1/x", err: "no repository"},
		{image: ":v1.35.2", err: "no repository"},
		{image: "registry.k8s.io/kube-apiserver@sha256:abc", err: `digest "sha256:abc" is not algorithm:hex`},
	} {
		t.Run(tc.image, func(t *testing.T) {
			assert.Equal(t, tc.repository, RepositoryOf(tc.image))
			assert.Equal(t, tc.tag, TagOf(tc.image))
			assert.Equal(t, tc.digest, DigestOf(tc.image))

			got, err := WithTag(tc.image, "v1.36.3")
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)

				return
			}

			require.NoError(t, err)
			assert.Equal(t, tc.withTag, got)
		})
	}
}

func TestWithTagRefusesBadTag(t *testing.T) {
	for _, tag := range []string{"", ".v1", "-v1", "v1/2", "v1:2", "v1@x"} {
		t.Run(tag, func(t *testing.T) {
			_, err := WithTag("registry.k8s.io/kube-apiserver:v1.35.2", tag)
			require.ErrorContains(t, err, "is not a valid image tag")
		})
	}
}
