// Command validate reads the output of `helm template` on stdin and decodes every object
// strictly into its Kubernetes API type (k8s.io/api; the Prometheus Operator's types for
// ServiceMonitor and PrometheusRule): an unknown or misspelt field, or a value of the wrong
// type, is an error. It stands in for kubeconform, whose JSON schemas are downloaded from
// GitHub at run time (docs/OPERATIONS.md). scripts/test runs it on the chart.
package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"strings"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// typed returns an empty object of the kind, or nil for a kind it does not know.
func typed(apiVersion, kind string) any {
	switch apiVersion + "/" + kind {
	case "apps/v1/Deployment":
		return &appsv1.Deployment{}
	case "batch/v1/Job":
		return &batchv1.Job{}
	case "v1/Service":
		return &corev1.Service{}
	case "v1/Secret":
		return &corev1.Secret{}
	case "v1/ConfigMap":
		return &corev1.ConfigMap{}
	case "v1/Pod":
		return &corev1.Pod{}
	case "monitoring.coreos.com/v1/ServiceMonitor":
		return &monitoringv1.ServiceMonitor{}
	case "monitoring.coreos.com/v1/PrometheusRule":
		return &monitoringv1.PrometheusRule{}
	}
	return nil
}

func main() {
	input, err := io.ReadAll(bufio.NewReader(os.Stdin))
	if err != nil {
		fmt.Fprintln(os.Stderr, "validate: reading stdin:", err)
		os.Exit(2)
	}
	failed, checked := 0, 0
	for _, doc := range strings.Split(string(input), "\n---") {
		if len(bytes.TrimSpace([]byte(doc))) == 0 {
			continue
		}
		var head struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
			Metadata   struct {
				Name string `json:"name"`
			} `json:"metadata"`
		}
		if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
			fmt.Fprintln(os.Stderr, "validate: not YAML:", err)
			failed++
			continue
		}
		if head.Kind == "" {
			continue // a document of comments only
		}
		object := typed(head.APIVersion, head.Kind)
		name := fmt.Sprintf("%s %s (%s)", head.Kind, head.Metadata.Name, head.APIVersion)
		if object == nil {
			fmt.Fprintln(os.Stderr, "validate: no type known for", name)
			failed++
			continue
		}
		if err := yaml.UnmarshalStrict([]byte(doc), object); err != nil {
			fmt.Fprintf(os.Stderr, "validate: %s: %v\n", name, err)
			failed++
			continue
		}
		checked++
	}
	fmt.Printf("validate: %d objects decoded strictly, %d failed\n", checked, failed)
	if failed > 0 || checked == 0 {
		os.Exit(1)
	}
}
