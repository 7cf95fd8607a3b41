// Limited by proxy.ts: the handler itself knows nothing of it.
export const dynamic = "force-dynamic";

export function GET() {
  return Response.json({ hello: "world" });
}
