package ssrf

import (
	"fmt"
	"strconv"
	"strings"
)

// AnyPort is the GENBOX_CALLBACK_PORTS value that admits every port.
const AnyPort = "any"

// ParsePorts reads GENBOX_CALLBACK_PORTS: a comma-separated list of ports, or AnyPort (nil:
// every port). The publisher and the worker's schedule firer apply the same list.
func ParsePorts(v string) ([]uint16, error) {
	if strings.TrimSpace(v) == AnyPort {
		return nil, nil
	}
	var ports []uint16
	for _, f := range strings.Split(v, ",") {
		n, err := strconv.ParseUint(strings.TrimSpace(f), 10, 16)
		if err != nil || n == 0 {
			return nil, fmt.Errorf("%q is not a port (a comma-separated list of 1-65535, or %q)", f, AnyPort)
		}
		ports = append(ports, uint16(n))
	}
	return ports, nil
}
