#version 450
// Built-in element-wise multiply: c[i] = a[i] * b[i]. ELEMENT is defined at build time.
// Dispatched as a grid of workgroups of 64 invocations (MultiplyWorkgroup in shader.h), with up to
// 65535 workgroups per dimension: invocation i is numbered row by row (x fastest, then y, then
// z), and those at or past c's length do nothing.
layout(local_size_x = 64) in;
layout(set = 0, binding = 0) readonly buffer A { ELEMENT a[]; };
layout(set = 0, binding = 1) readonly buffer B { ELEMENT b[]; };
layout(set = 0, binding = 2) writeonly buffer C { ELEMENT c[]; };
void main() {
  uint row = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
  uint i = gl_GlobalInvocationID.x +
           row * (gl_GlobalInvocationID.y + gl_NumWorkGroups.y * gl_GlobalInvocationID.z);
  if (i >= uint(c.length())) return;
  c[i] = a[i] * b[i];
}
