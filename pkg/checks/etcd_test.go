package checks_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/checks"
	"github.com/ichor-dev/kubectl-ichor/pkg/discovery/discoverytest"
	"github.com/ichor-dev/kubectl-ichor/pkg/stages"
	"github.com/ichor-dev/kubectl-ichor/pkg/talos"
)

// healthyEtcd is the view of n control planes cp-1..cp-n, cp-1 leading.
func healthyEtcd(n int) *stages.EtcdView {
	v := &stages.EtcdView{Status: map[string]talos.EtcdStatus{}, StatusErr: map[string]error{}, ListedBy: "cp-1"}

	for i := 1; i <= n; i++ {
		name := fmt.Sprintf("cp-%d", i)
		v.ControlPlanes = append(v.ControlPlanes, stages.EtcdNode{Name: name, IP: fmt.Sprintf("10.0.0.1%d", i)})
		v.Members = append(v.Members, talos.EtcdMember{ID: uint64(i), Hostname: name})
		v.Status[name] = talos.EtcdStatus{MemberID: uint64(i), Leader: 1, RaftIndex: 100}
	}

	return v
}

func oneControlPlane() *discoverytest.Cluster {
	c := discoverytest.New()
	c.ControlPlane("cp-1", "10.0.0.11")

	return c
}

func TestEtcdQuorumCheck(t *testing.T) {
	target := stages.MustParseVersion("v1.14.1")

	stopped := healthyEtcd(3)
	delete(stopped.Status, "cp-3")
	stopped.StatusErr["cp-3"] = errors.New("etcd status: context deadline exceeded")

	for _, tc := range []struct {
		name    string
		cluster *discoverytest.Cluster
		etcd    *stages.EtcdView
		allow   bool
		result  string
		detail  string
		action  string
	}{
		{name: "3 healthy", cluster: discoverytest.ThreePlusTwo(), etcd: healthyEtcd(3), result: api.ResultOK,
			detail: "3 voter(s) healthy; quorum 2 kept while each of cp-1, cp-2, cp-3 reboots"},
		{name: "a member down", cluster: discoverytest.ThreePlusTwo(), etcd: stopped, result: api.ResultRefused,
			detail: "etcd is not healthy: member cp-3 does not answer etcd status: etcd status: context deadline exceeded",
			action: "talosctl -n 10.0.0.13 etcd status"},
		{name: "one control plane", cluster: oneControlPlane(), etcd: healthyEtcd(1),
			result: api.ResultRefused, detail: "etcd has 1 voting member(s), quorum 1: rebooting cp-1 leaves 0", action: "--allow-etcd-outage"},
		{name: "one control plane, outage accepted", cluster: oneControlPlane(), etcd: healthyEtcd(1),
			allow: true, result: api.ResultWarn, detail: "accepted (--allow-etcd-outage)"},
		{name: "not read", cluster: discoverytest.ThreePlusTwo(), result: api.ResultWarn, detail: "etcd was not read through Talos"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := checks.EtcdQuorum{}.Run(context.Background(), &checks.Input{
				Snapshot: tc.cluster.Snapshot(t), Target: target, Etcd: tc.etcd, AllowEtcdOutage: tc.allow,
			})
			assert.Equal(t, tc.result, r.Result, r.Detail)
			assert.Contains(t, r.Detail, tc.detail)
			assert.Contains(t, r.Action, tc.action)
		})
	}

	t.Run("no control plane to reboot", func(t *testing.T) {
		r := checks.EtcdQuorum{}.Run(context.Background(), &checks.Input{
			Snapshot: discoverytest.ThreePlusTwo().Snapshot(t), Target: stages.MustParseVersion("v1.13.9"),
		})
		assert.Equal(t, api.ResultOK, r.Result)
		assert.Equal(t, "no control plane to reboot", r.Detail)
	})
}
