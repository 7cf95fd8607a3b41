export default function Home() {
  return <p>ratelimit-web in a Next.js app: GET /api/hello (limited in proxy.ts), GET /limited (in its route handler).</p>;
}
