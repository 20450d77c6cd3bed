/* Stand-in for the GPU tests in a build without the CUDA backend: always a skip (exit 77). */
#include <stdio.h>

int main(void)
{
	printf("this build has no CUDA backend (-Dcuda=disabled or no CUDA Toolkit): GPU tests skipped\n");
	return 77;
}
