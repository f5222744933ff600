// Command kube is kube-apiserver, kube-controller-manager, kube-scheduler and kubectl in one
// binary, so the Kubernetes tree is linked once for the test control plane instead of four times.
// It runs the component named by the name it was started under (scripts/control-plane links each
// name to it) or by its first argument. kubectl is there for the documentation tests, which run
// the docs' kubectl lines against the test control plane.
package main

import (
	"fmt"
	"os"
	"path/filepath"
	_ "time/tzdata" // CronJob time zones, as the upstream commands embed them

	"github.com/spf13/cobra"
	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kubectl "k8s.io/kubectl/pkg/cmd"
	kubectlutil "k8s.io/kubectl/pkg/cmd/util"
)

func command(name string) *cobra.Command {
	switch name {
	case "kube-apiserver":
		return apiserver.NewAPIServerCommand()
	case "kube-controller-manager":
		return controllermanager.NewControllerManagerCommand()
	case "kube-scheduler":
		return scheduler.NewSchedulerCommand()
	case "kubectl":
		return kubectl.NewDefaultKubectlCommand()
	}
	return nil
}

func main() {
	cmd := command(filepath.Base(os.Args[0]))
	if cmd == nil && len(os.Args) > 1 {
		if cmd = command(os.Args[1]); cmd != nil {
			os.Args = append(os.Args[:1], os.Args[2:]...)
		}
	}
	if cmd == nil {
		fmt.Fprintln(os.Stderr, "usage: kube {kube-apiserver|kube-controller-manager|kube-scheduler|kubectl} [flags]")
		os.Exit(2)
	}
	if cmd.Name() == "kubectl" {
		// kubectl prints its own errors, in its own format, as the upstream command does.
		if err := cli.RunNoErrOutput(cmd); err != nil {
			kubectlutil.CheckErr(err)
		}
		return
	}
	os.Exit(cli.Run(cmd))
}
