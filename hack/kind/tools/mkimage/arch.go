package main

import "runtime"

func goarch() string { return runtime.GOARCH }
