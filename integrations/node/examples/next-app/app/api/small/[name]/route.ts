// Limited by proxy.ts (a smaller limit, and tiers).
export const dynamic = "force-dynamic";

export async function GET(request: Request, { params }: { params: Promise<{ name: string }> }) {
  return Response.json({ small: (await params).name });
}
